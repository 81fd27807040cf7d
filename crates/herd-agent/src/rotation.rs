//! A password rotation across hosts (`herd secrets rotate --dcs`, issue #42 part 4): the
//! record the command writes at the store's root, and what each member (agent or `herd
//! proxy`) does with it at its next round ([`follow`]).
//!
//! The record carries the next passwords sealed under the *current* superuser password
//! (`herd_apikey::seal`: ChaCha20-Poly1305, key by HKDF-SHA256), and a check text sealed under
//! the *next* one, by which a member that has already taken them up recognises itself. A
//! member acknowledges in its member record (or proxy registration) with [`held`] once its
//! `secrets/*.next` files hold them, and with [`applied`] once it has renamed them over the
//! current files (after the command marked the record `applied`: the servers changed).

use herd_apikey::seal::{open, seal, SealError};
use herd_cluster::{Layout, Rotation, Secrets, REPLICATION_USER};
use serde::{Deserialize, Serialize};

/// The rotation record's key, at the store's root (one for every shard group).
pub const SECRETS_ROTATION: &str = "secrets_rotation";

/// The acknowledgement of a member whose secrets cannot open the record (they are not the
/// cluster's current ones).
pub const CANNOT_OPEN: &str = "cannot open";

/// The check text sealed under the next superuser password.
const CHECK: &[u8] = b"herd next passwords";

/// A rotation under way across hosts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RotationRecord {
    /// Random: tells this rotation's acknowledgements from an earlier one's.
    pub id: String,
    /// The next passwords (JSON), sealed under the current superuser password.
    pub sealed: String,
    /// [`CHECK`] sealed under the next superuser password.
    pub check: String,
    /// The servers have the next passwords: members rename their `.next` files over.
    pub applied: bool,
}

#[derive(Serialize, Deserialize)]
struct Plain {
    superuser: String,
    replication: String,
}

impl RotationRecord {
    /// A new rotation from `current` to `next`.
    pub fn new(current: &Secrets, next: &Secrets) -> Result<RotationRecord, SealError> {
        let plain = serde_json::to_vec(&Plain {
            superuser: next.superuser.clone(),
            replication: next.replication.clone(),
        })
        .map_err(|_| SealError::Malformed)?;
        Ok(RotationRecord {
            id: {
                use rand::distributions::{Alphanumeric, DistString};
                Alphanumeric.sample_string(&mut rand::thread_rng(), 12)
            },
            sealed: seal(&current.superuser, &plain)?,
            check: seal(&next.superuser, CHECK)?,
            applied: false,
        })
    }

    /// The next passwords, opened with the current superuser password.
    pub fn next(&self, current_superuser: &str) -> Result<Secrets, SealError> {
        let plain = open(current_superuser, &self.sealed)?;
        let p: Plain = serde_json::from_slice(&plain).map_err(|_| SealError::Malformed)?;
        Ok(Secrets {
            superuser: p.superuser,
            replication: p.replication,
        })
    }

    /// The record's last form once every live member renamed: the passwords gone, the key
    /// expiring.
    pub fn finish(&self) -> RotationRecord {
        RotationRecord {
            id: self.id.clone(),
            sealed: String::new(),
            check: String::new(),
            applied: true,
        }
    }

    /// Whether this is the record's last form ([`RotationRecord::finish`]).
    pub fn finished(&self) -> bool {
        self.sealed.is_empty()
    }

    /// Whether `superuser` is this rotation's next password (a member that took it up).
    pub fn is_next(&self, superuser: &str) -> bool {
        open(superuser, &self.check).is_ok_and(|c| c == CHECK)
    }
}

/// The acknowledgement of a member holding rotation `id`'s next passwords.
pub fn held(id: &str) -> String {
    id.to_string()
}

/// The acknowledgement of a member that renamed rotation `id`'s passwords over its current ones.
pub fn applied(id: &str) -> String {
    format!("{id} applied")
}

/// The members (name, acknowledgement) that have not acknowledged rotation `id` as far as
/// `stage` asks: holding the next passwords (`applied == false`; one that already renamed
/// counts) or having renamed them (`applied == true`).
pub fn unacknowledged(
    members: &[(String, Option<String>)],
    id: &str,
    stage_applied: bool,
) -> Vec<String> {
    let (h, a) = (held(id), applied(id));
    members
        .iter()
        .filter(|(_, ack)| {
            let ack = ack.as_deref();
            let done = ack == Some(a.as_str()) || (!stage_applied && ack == Some(h.as_str()));
            !done
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// `herd status --dcs`'s line about a password rotation under way: each member's
/// acknowledgement (`None` when no member shows one).
pub fn status_line(members: &[crate::member::Member]) -> Option<String> {
    let acks: Vec<String> = members
        .iter()
        .filter_map(|m| {
            let ack = m.secrets_rotation.as_deref()?;
            let what = match ack.split_once(' ') {
                Some((_, "applied")) => "uses the new passwords",
                _ if ack == CANNOT_OPEN => "cannot open them (another secrets directory?)",
                _ => "holds the next passwords",
            };
            Some(format!("{} {what}", m.name))
        })
        .collect();
    (!acks.is_empty()).then(|| format!("password rotation under way: {}", acks.join(", ")))
}

/// Where a member stands in a rotation, after [`follow`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Its `.next` files hold the next passwords (its acknowledgement: [`held`]).
    Holds {
        /// The rotation.
        id: String,
        /// The passwords it holds besides its current ones.
        next: Secrets,
    },
    /// Its current files hold the next passwords (its acknowledgement: [`applied`]).
    Renamed {
        /// The rotation.
        id: String,
        /// The passwords it used before, when this call renamed them (still accepted by its
        /// API from members that have not renamed yet).
        previous: Option<Secrets>,
    },
}

impl Standing {
    /// The acknowledgement to publish.
    pub fn ack(&self) -> String {
        match self {
            Standing::Holds { id, .. } => held(id),
            Standing::Renamed { id, .. } => applied(id),
        }
    }
}

/// Takes up `record` in `layout`'s secrets: writes the next passwords to the `.next` files
/// (0600) while the rotation is pending, renames them over the current ones once it is
/// applied. Idempotent (run every round); an error names what failed (a secrets directory that
/// is not the cluster's current one cannot open the record).
pub fn follow(layout: &Layout, record: &RotationRecord) -> Result<Standing, String> {
    if record.finished() {
        return Ok(Standing::Renamed {
            id: record.id.clone(),
            previous: None,
        });
    }
    let current = Secrets::load(layout).map_err(|e| e.to_string())?;
    if record.is_next(&current.superuser) {
        Rotation::forget_staged(layout).map_err(|e| e.to_string())?;
        return Ok(Standing::Renamed {
            id: record.id.clone(),
            previous: None,
        });
    }
    let next = record.next(&current.superuser).map_err(|e| {
        format!(
            "cannot open the next passwords of rotation {} ({e}): {} does not hold the \
             cluster's current superuser password",
            record.id,
            layout.secrets().display()
        )
    })?;
    let rotation = if Rotation::staged(layout).as_ref() == Some(&next) {
        Rotation {
            current: current.clone(),
            next: next.clone(),
            resumed: true,
        }
    } else {
        Rotation::stage(layout, current.clone(), next.clone()).map_err(|e| e.to_string())?
    };
    if !record.applied {
        return Ok(Standing::Holds {
            id: record.id.clone(),
            next,
        });
    }
    rotation
        .finish(layout, REPLICATION_USER)
        .map_err(|e| e.to_string())?;
    Ok(Standing::Renamed {
        id: record.id.clone(),
        previous: Some(current),
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn acks(list: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        list.iter()
            .map(|(n, a)| (n.to_string(), a.map(str::to_string)))
            .collect()
    }

    #[test]
    fn who_has_not_acknowledged() {
        let members = acks(&[
            ("h1", Some("r1")),
            ("h2", Some("r1 applied")),
            ("h3", None),
            ("h4", Some("r0 applied")),
            ("h5", Some("r0")),
        ]);
        assert_eq!(unacknowledged(&members, "r1", false), ["h3", "h4", "h5"]);
        assert_eq!(
            unacknowledged(&members, "r1", true),
            ["h1", "h3", "h4", "h5"]
        );
        assert!(unacknowledged(&acks(&[("a", Some("r1"))]), "r1", false).is_empty());
        assert!(unacknowledged(&[], "r1", true).is_empty());
    }

    #[test]
    fn the_status_line_names_each_members_standing() {
        let mut members = vec![
            crate::decide::tests::member("h0", "primary", 1),
            crate::decide::tests::member("h1", "replica", 1),
            crate::decide::tests::member("h2", "replica", 1),
        ];
        assert_eq!(status_line(&members), None);
        members[0].secrets_rotation = Some(held("r1"));
        members[1].secrets_rotation = Some(applied("r1"));
        members[2].secrets_rotation = Some(CANNOT_OPEN.into());
        assert_eq!(
            status_line(&members).as_deref(),
            Some(
                "password rotation under way: h0 holds the next passwords, h1 uses the new \
                 passwords, h2 cannot open them (another secrets directory?)"
            )
        );
    }

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::metadata(path).expect("meta").permissions().mode() & 0o777
    }

    #[test]
    fn a_member_holds_then_renames() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(tmp.path());
        let old = Secrets::generate();
        old.save(&layout, REPLICATION_USER).expect("save");
        let next = Secrets::generate();
        let mut record = RotationRecord::new(&old, &next).expect("record");
        assert!(!record.is_next(&old.superuser));
        assert!(record.is_next(&next.superuser));
        assert_eq!(
            record.next(&next.superuser),
            Err(SealError::WrongKey),
            "only the current password opens it"
        );

        let standing = follow(&layout, &record).expect("follow");
        assert_eq!(standing.ack(), held(&record.id));
        assert_eq!(Rotation::staged(&layout), Some(next.clone()));
        for f in ["superuser.password.next", "replication.password.next"] {
            assert_eq!(mode(&layout.secrets().join(f)), 0o600, "{f}");
        }
        assert_eq!(
            Secrets::load(&layout).expect("load"),
            old,
            "not renamed yet"
        );
        // Every round: the same.
        assert_eq!(follow(&layout, &record).expect("again"), standing);

        record.applied = true;
        let renamed = follow(&layout, &record).expect("applied");
        assert_eq!(
            renamed,
            Standing::Renamed {
                id: record.id.clone(),
                previous: Some(old.clone())
            }
        );
        assert_eq!(Secrets::load(&layout).expect("load"), next);
        assert_eq!(Rotation::staged(&layout), None);
        assert_eq!(
            follow(&layout, &record).expect("later round").ack(),
            applied(&record.id)
        );

        // A directory that is not the cluster's: a clear error, nothing written.
        let other = tempfile::tempdir().expect("tempdir");
        let other_layout = Layout::new(other.path());
        Secrets::generate()
            .save(&other_layout, REPLICATION_USER)
            .expect("save");
        let err = follow(&other_layout, &RotationRecord::new(&old, &next).expect("r"))
            .expect_err("foreign");
        assert!(err.contains("current superuser password"), "{err}");
        assert_eq!(Rotation::staged(&other_layout), None);
    }
}
