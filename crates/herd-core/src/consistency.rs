//! Read consistency levels and pooling modes of the proxy.

use std::fmt;
use std::str::FromStr;

use crate::ParseError;

/// What a read may see, per connection, transaction or statement (`herd.consistency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Consistency {
    /// Read-your-writes: reads see at least every commit this session made (WAL LSN tokens).
    #[default]
    Session,
    /// Replicas at most `max_staleness` behind the primary.
    Bounded,
    /// Any healthy replica.
    Eventual,
    /// Everything on the primary.
    Primary,
}

impl Consistency {
    /// Every level.
    pub const ALL: [Consistency; 4] = [
        Consistency::Session,
        Consistency::Bounded,
        Consistency::Eventual,
        Consistency::Primary,
    ];

    /// The level's name in settings.
    pub fn as_str(self) -> &'static str {
        match self {
            Consistency::Session => "session",
            Consistency::Bounded => "bounded",
            Consistency::Eventual => "eventual",
            Consistency::Primary => "primary",
        }
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Consistency {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().trim_matches('\'').to_ascii_lowercase();
        Consistency::ALL
            .into_iter()
            .find(|c| c.as_str() == wanted)
            .ok_or_else(|| {
                ParseError::new(
                    "consistency level",
                    s,
                    "one of session, bounded, eventual, primary",
                )
            })
    }
}

/// When a server connection returns to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PoolMode {
    /// After each transaction (the default): many clients share few server connections.
    #[default]
    Transaction,
    /// When the client disconnects.
    Session,
}

impl PoolMode {
    /// The mode's name in settings.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Transaction => "transaction",
            PoolMode::Session => "session",
        }
    }
}

impl fmt::Display for PoolMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PoolMode {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "transaction" => Ok(PoolMode::Transaction),
            "session" => Ok(PoolMode::Session),
            _ => Err(ParseError::new("pool mode", s, "transaction or session")),
        }
    }
}

crate::commit::serde_via_str!(Consistency);
crate::commit::serde_via_str!(PoolMode);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_levels() {
        assert_eq!(
            "session".parse::<Consistency>().ok(),
            Some(Consistency::Session)
        );
        assert_eq!(
            "'Eventual'".parse::<Consistency>().ok(),
            Some(Consistency::Eventual)
        );
        assert!("strong".parse::<Consistency>().is_err());
        assert_eq!("session".parse::<PoolMode>().ok(), Some(PoolMode::Session));
        assert!("statement".parse::<PoolMode>().is_err());
    }
}
