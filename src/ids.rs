//! Volume and snapshot ids: derived from the CSI name, checked before they reach the
//! filesystem.
//!
//! An id is `fv-` (volumes) or `fvs-` (snapshots) followed by 32 lowercase hex digits of
//! the SHA-256 of the name. A retry
//! of CreateVolume after a crash therefore lands on the same id, and an id from a request
//! can be used as a file name only after [`VolumeId::parse`] accepted it: no `/`, no `..`,
//! no surprises.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

const HEX_LEN: usize = 32;
/// The longest id any request may carry (the CSI spec's size limit for ids).
pub const MAX_ID_LEN: usize = 128;

/// What a request's id string turned out to be.
#[derive(Debug)]
pub enum ParsedId<T> {
    /// One of ours (it may or may not exist).
    Ours(T),
    /// Well within the size limits, but no ferrovol driver ever made it.
    Foreign,
}

fn derive(prefix: &str, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut id = String::with_capacity(prefix.len() + HEX_LEN);
    id.push_str(prefix);
    for byte in &digest[..HEX_LEN / 2] {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

fn check(prefix: &str, field: &str, raw: &str) -> Result<bool> {
    if raw.is_empty() {
        return Err(Error::InvalidArgument(format!("{field} is required")));
    }
    if raw.len() > MAX_ID_LEN {
        return Err(Error::InvalidArgument(format!(
            "{field} is {} bytes long; at most {MAX_ID_LEN} are allowed",
            raw.len()
        )));
    }
    Ok(raw.len() == prefix.len() + HEX_LEN
        && raw.starts_with(prefix)
        && raw[prefix.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:expr, $what:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Derives the id of the object called `name`.
            pub fn from_name(name: &str) -> Self {
                $name(derive($prefix, name))
            }

            /// Checks an id taken from a request.
            ///
            /// # Errors
            /// `InvalidArgument` when it is empty or longer than the spec allows.
            pub fn parse(field: &str, raw: &str) -> Result<ParsedId<Self>> {
                Ok(if check($prefix, field, raw)? {
                    ParsedId::Ours($name(raw.to_owned()))
                } else {
                    ParsedId::Foreign
                })
            }

            /// Checks an id that must name one of ours.
            ///
            /// # Errors
            /// `InvalidArgument` as for `parse`; `NotFound` for an id of another driver.
            pub fn parse_ours(field: &str, raw: &str) -> Result<Self> {
                match Self::parse(field, raw)? {
                    ParsedId::Ours(id) => Ok(id),
                    ParsedId::Foreign => Err(Error::NotFound(format!(
                        "{} {raw:?} does not exist: it is not a ferrovol {} id",
                        $what, $what
                    ))),
                }
            }

            /// The id as a string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A checked ferrovol volume id: `fv-` and 32 hex digits.
    VolumeId,
    "fv-",
    "volume"
);
id_type!(
    /// A checked ferrovol snapshot id: `fvs-` and 32 hex digits.
    SnapshotId,
    "fvs-",
    "snapshot"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_parse_back() {
        let a = VolumeId::from_name("pvc-1");
        assert_eq!(a, VolumeId::from_name("pvc-1"));
        assert_ne!(a, VolumeId::from_name("pvc-2"));
        assert!(
            matches!(VolumeId::parse("volume_id", a.as_str()), Ok(ParsedId::Ours(b)) if b == a)
        );
    }

    #[test]
    fn hostile_ids_never_parse_as_ours() {
        for raw in [
            "../etc",
            "fv-../../../../../../../../../../x",
            "fv-ABCDEF",
            "a/b",
            "fv-",
        ] {
            assert!(
                matches!(VolumeId::parse("volume_id", raw), Ok(ParsedId::Foreign)),
                "{raw}"
            );
        }
        assert!(VolumeId::parse("volume_id", "").is_err());
        assert!(VolumeId::parse("volume_id", &"x".repeat(129)).is_err());
    }

    #[test]
    fn snapshot_and_volume_ids_do_not_mix() {
        let snap = SnapshotId::from_name("snap-1");
        assert!(snap.as_str().starts_with("fvs-"));
        assert!(matches!(
            VolumeId::parse("volume_id", snap.as_str()),
            Ok(ParsedId::Foreign)
        ));
        let vol = VolumeId::from_name("snap-1");
        assert!(matches!(
            SnapshotId::parse("snapshot_id", vol.as_str()),
            Ok(ParsedId::Foreign)
        ));
    }
}
