//! SCRAM-SHA-256 (RFC 5802 / RFC 7677) as PostgreSQL speaks it, without
//! channel binding (GS2 header `n,,`, or `y,,` from a client that supports
//! channel binding but was not offered `SCRAM-SHA-256-PLUS`).
//!
//! The crate is pure: it only turns protocol messages into protocol messages,
//! the caller moves the bytes (inside `AuthenticationSASL*` / `SASL*Response`
//! packets).
//!
//! * [`Verifier`] is the value PostgreSQL stores in `pg_authid.rolpassword`:
//!   `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
//! * [`ServerExchange`] authenticates a client with nothing but a verifier and,
//!   on success, hands back the client's [`ClientKey`]
//!   (`ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage)`).
//! * [`ClientExchange`] logs in to a server either with a password or with a
//!   recovered [`ClientKey`] (the proxy's pass-through): knowing the ClientKey is
//!   enough to compute a valid proof, and knowing the ServerKey (from the
//!   verifier) is enough to check the server's signature.
//!
//! Passwords are used as their raw UTF-8 bytes. PostgreSQL runs passwords
//! through SASLprep first, which leaves every ASCII password unchanged; a
//! non-ASCII password only matches if it is already in SASLprep form.

mod client;
mod crypto;
mod parse;
mod server;

pub use client::ClientExchange;
pub use server::ServerExchange;

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use subtle::ConstantTimeEq;

/// SASL mechanism name to advertise in `AuthenticationSASL` / select in
/// `SASLInitialResponse`.
pub const MECHANISM: &str = "SCRAM-SHA-256";

/// Iteration count PostgreSQL uses by default (`scram_iterations`).
pub const DEFAULT_ITERATIONS: u32 = 4096;

/// Salt length (bytes) PostgreSQL uses for new verifiers.
pub const DEFAULT_SALT_LEN: usize = 16;

/// Number of random bytes in a nonce we generate (base64-encoded on the wire).
const NONCE_BYTES: usize = 18;

/// Errors of SCRAM parsing and verification. Messages never contain secrets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// A SCRAM message does not follow the grammar; the text says what is wrong.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The client asked for channel binding (`p=` GS2 flag), which we do not offer.
    #[error("SCRAM channel binding is not supported")]
    ChannelBindingUnsupported,
    /// The channel-binding data (`c=`) does not match the GS2 header of the first message.
    #[error("SCRAM channel binding data does not match the GS2 header")]
    ChannelBindingMismatch,
    /// The nonce of a message does not continue the nonce of the exchange.
    #[error("SCRAM nonce mismatch")]
    NonceMismatch,
    /// The client's proof is wrong (wrong password or key, or unknown user).
    #[error("SCRAM authentication failed")]
    AuthFailed,
    /// The server's signature (`v=`) is wrong: the server does not know the verifier.
    #[error("SCRAM server signature mismatch")]
    ServerSignatureMismatch,
    /// The server reported an error (`e=`) in its final message.
    #[error("SCRAM server error: {0}")]
    ServerError(String),
    /// A stored verifier (`rolpassword`) cannot be parsed.
    #[error("invalid SCRAM verifier: {0}")]
    BadVerifier(&'static str),
    /// The server's salt or iteration count differs from the verifier the
    /// ClientKey was recovered with (the password was changed meanwhile).
    #[error("server's SCRAM salt/iterations differ from the expected verifier")]
    VerifierMismatch,
    /// A method was called out of order (e.g. `server_final` before `server_first`).
    #[error("SCRAM exchange step out of order: {0}")]
    InvalidState(&'static str),
}

/// A client's SCRAM `ClientKey` (`HMAC(SaltedPassword, "Client Key")`).
///
/// Whoever holds it can log in as the user (as long as the verifier is not
/// changed), so it is as sensitive as a password: `Debug` does not print it
/// and equality is constant-time.
#[derive(Clone)]
pub struct ClientKey([u8; 32]);

impl ClientKey {
    /// Wraps raw key bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ClientKey(bytes)
    }

    /// The raw key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// `StoredKey = H(ClientKey)`.
    pub fn stored_key(&self) -> [u8; 32] {
        crypto::sha256(&self.0)
    }

    /// Whether this key belongs to `verifier` (`H(ClientKey) == StoredKey`), in constant time.
    pub fn matches(&self, verifier: &Verifier) -> bool {
        bool::from(self.stored_key().ct_eq(&verifier.stored_key))
    }
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientKey(<redacted>)")
    }
}

impl PartialEq for ClientKey {
    fn eq(&self, other: &Self) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }
}

impl Eq for ClientKey {}

/// A SCRAM-SHA-256 verifier as stored by PostgreSQL in `pg_authid.rolpassword`.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    iterations: u32,
    salt: Vec<u8>,
    stored_key: [u8; 32],
    server_key: [u8; 32],
}

impl Verifier {
    /// Parses `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`
    /// (salt and keys in standard padded base64, keys 32 bytes, iterations >= 1).
    pub fn parse(rolpassword: &str) -> Result<Verifier, ScramError> {
        let rest = rolpassword
            .strip_prefix("SCRAM-SHA-256$")
            .ok_or(ScramError::BadVerifier("not a SCRAM-SHA-256 verifier"))?;
        let (params, keys) = rest
            .split_once('$')
            .ok_or(ScramError::BadVerifier("missing '$' before the keys"))?;
        let (iterations, salt) = params.split_once(':').ok_or(ScramError::BadVerifier(
            "missing ':' after the iteration count",
        ))?;
        let (stored_key, server_key) = keys
            .split_once(':')
            .ok_or(ScramError::BadVerifier("missing ':' between the keys"))?;
        let iterations = parse::parse_iterations(iterations)
            .ok_or(ScramError::BadVerifier("bad iteration count"))?;
        let salt = B64
            .decode(salt)
            .map_err(|_| ScramError::BadVerifier("salt is not base64"))?;
        if salt.is_empty() {
            return Err(ScramError::BadVerifier("empty salt"));
        }
        let stored_key = parse::decode_key(stored_key).ok_or(ScramError::BadVerifier(
            "StoredKey is not 32 bytes of base64",
        ))?;
        let server_key = parse::decode_key(server_key).ok_or(ScramError::BadVerifier(
            "ServerKey is not 32 bytes of base64",
        ))?;
        Ok(Verifier {
            iterations,
            salt,
            stored_key,
            server_key,
        })
    }

    /// Derives the verifier of `password` (raw bytes, see the crate docs on
    /// SASLprep) with the given salt and iteration count.
    ///
    /// # Panics
    /// If `iterations` is 0 or `salt` is empty (no valid verifier exists).
    pub fn from_password(password: &str, salt: &[u8], iterations: u32) -> Verifier {
        assert!(iterations >= 1, "SCRAM iteration count must be >= 1");
        assert!(!salt.is_empty(), "SCRAM salt must not be empty");
        let keys = crypto::Keys::from_password(password.as_bytes(), salt, iterations);
        Verifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: keys.client_key.stored_key(),
            server_key: keys.server_key,
        }
    }

    /// Derives a verifier for `password` with a fresh random 16-byte salt and
    /// [`DEFAULT_ITERATIONS`], as `ALTER ROLE ... PASSWORD` would.
    pub fn generate(password: &str) -> Verifier {
        let mut salt = [0u8; DEFAULT_SALT_LEN];
        crypto::random_bytes(&mut salt);
        Verifier::from_password(password, &salt, DEFAULT_ITERATIONS)
    }

    /// Builds a verifier from its parts.
    pub fn from_parts(
        iterations: u32,
        salt: Vec<u8>,
        stored_key: [u8; 32],
        server_key: [u8; 32],
    ) -> Result<Verifier, ScramError> {
        if iterations == 0 {
            return Err(ScramError::BadVerifier("bad iteration count"));
        }
        if salt.is_empty() {
            return Err(ScramError::BadVerifier("empty salt"));
        }
        Ok(Verifier {
            iterations,
            salt,
            stored_key,
            server_key,
        })
    }

    /// PBKDF2 iteration count.
    pub fn iterations(&self) -> u32 {
        self.iterations
    }

    /// Salt (raw bytes).
    pub fn salt(&self) -> &[u8] {
        &self.salt
    }

    /// `StoredKey = H(ClientKey)`.
    pub fn stored_key(&self) -> &[u8; 32] {
        &self.stored_key
    }

    /// `ServerKey = HMAC(SaltedPassword, "Server Key")`.
    pub fn server_key(&self) -> &[u8; 32] {
        &self.server_key
    }
}

/// Formats the verifier exactly as PostgreSQL stores it.
impl std::fmt::Display for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

/// Shows iterations and salt only; the keys are redacted.
impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("iterations", &self.iterations)
            .field("salt", &B64.encode(&self.salt))
            .field("stored_key", &"<redacted>")
            .field("server_key", &"<redacted>")
            .finish()
    }
}

impl std::str::FromStr for Verifier {
    type Err = ScramError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Verifier::parse(s)
    }
}

/// A fresh printable nonce: 18 random bytes in base64 (24 characters, no ',').
fn generate_nonce() -> String {
    let mut bytes = [0u8; NONCE_BYTES];
    crypto::random_bytes(&mut bytes);
    B64.encode(bytes)
}

#[cfg(test)]
mod tests;
