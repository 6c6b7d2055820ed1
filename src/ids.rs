//! Volume ids: derived from the CSI volume name, checked before they reach the filesystem.
//!
//! An id is `fv-` followed by 32 lowercase hex digits of the SHA-256 of the name. A retry
//! of CreateVolume after a crash therefore lands on the same id, and an id from a request
//! can be used as a file name only after [`VolumeId::parse`] accepted it: no `/`, no `..`,
//! no surprises.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

const PREFIX: &str = "fv-";
const HEX_LEN: usize = 32;
/// The longest id any request may carry (the CSI spec's size limit for ids).
pub const MAX_ID_LEN: usize = 128;

/// A checked ferrovol volume id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VolumeId(String);

/// What a request's id string turned out to be.
#[derive(Debug)]
pub enum ParsedId {
    /// One of ours (it may or may not exist).
    Ours(VolumeId),
    /// Well within the size limits, but no ferrovol driver ever made it.
    Foreign,
}

impl VolumeId {
    /// Derives the id of the volume called `name`.
    pub fn from_name(name: &str) -> Self {
        let digest = Sha256::digest(name.as_bytes());
        let mut id = String::with_capacity(PREFIX.len() + HEX_LEN);
        id.push_str(PREFIX);
        for byte in &digest[..HEX_LEN / 2] {
            id.push_str(&format!("{byte:02x}"));
        }
        VolumeId(id)
    }

    /// Checks an id taken from a request.
    ///
    /// # Errors
    /// `InvalidArgument` when it is empty or longer than the spec allows.
    pub fn parse(field: &str, raw: &str) -> Result<ParsedId> {
        if raw.is_empty() {
            return Err(Error::InvalidArgument(format!("{field} is required")));
        }
        if raw.len() > MAX_ID_LEN {
            return Err(Error::InvalidArgument(format!(
                "{field} is {} bytes long; at most {MAX_ID_LEN} are allowed",
                raw.len()
            )));
        }
        let ours = raw.len() == PREFIX.len() + HEX_LEN
            && raw.starts_with(PREFIX)
            && raw[PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        Ok(if ours {
            ParsedId::Ours(VolumeId(raw.to_owned()))
        } else {
            ParsedId::Foreign
        })
    }

    /// Checks an id that must name one of our volumes.
    ///
    /// # Errors
    /// `InvalidArgument` as for [`VolumeId::parse`]; `NotFound` for an id of another driver.
    pub fn parse_ours(field: &str, raw: &str) -> Result<VolumeId> {
        match Self::parse(field, raw)? {
            ParsedId::Ours(id) => Ok(id),
            ParsedId::Foreign => Err(Error::NotFound(format!(
                "volume {raw:?} does not exist: it is not a ferrovol volume id"
            ))),
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

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
}
