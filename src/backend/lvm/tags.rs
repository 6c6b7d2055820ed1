//! Volume and snapshot records kept in LV tags, so that the volume group alone can give a
//! restarted driver, or a new node pod with an empty state directory, every record back.
//!
//! # Design
//! LV tags may only hold `[A-Za-z0-9_+.-/=!:&#]` and at most 1024 characters each. A
//! record is therefore stored as compact JSON in standard base64 (whose alphabet is
//! allowed), cut into numbered tags: `fv.m.00=<part>`, `fv.m.01=<part>`, ... One more tag,
//! `fv.kind=volume` or `fv.kind=snapshot`, marks the LV as ferrovol's so that
//! `lvs @fv.kind=volume` lists them. The LV's name is the volume or snapshot id and its
//! size is the truth about capacity, so neither is stored again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::store::{ContentSource, SnapshotRecord, VolumeRecord};

/// The tag that marks a ferrovol volume LV.
pub const VOLUME_TAG: &str = "fv.kind=volume";
/// The tag that marks a ferrovol snapshot LV.
pub const SNAPSHOT_TAG: &str = "fv.kind=snapshot";
/// Prefix of the numbered tags that carry the record.
const PART_PREFIX: &str = "fv.m.";
/// Characters of base64 per tag: with `fv.m.NN=` the tag stays under lvm's 1024.
const PART_LEN: usize = 1000;
/// More parts than this would not be numbered in order with two digits.
const MAX_PARTS: usize = 100;

/// What a volume LV's tags hold.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct VolumeTags {
    /// The CSI name.
    n: String,
    /// The node the volume was made on.
    #[serde(default)]
    node: String,
    /// Creation parameters.
    #[serde(default)]
    p: BTreeMap<String, String>,
    /// Seconds since the epoch at creation.
    t: u64,
    /// Where the data came from.
    #[serde(default)]
    s: Option<ContentSource>,
}

/// What a snapshot LV's tags hold.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct SnapshotTags {
    /// The CSI name.
    n: String,
    /// The source volume id.
    v: String,
    /// Creation time: seconds and nanoseconds.
    t: i64,
    #[serde(default)]
    ns: i32,
    /// Creation parameters.
    #[serde(default)]
    p: BTreeMap<String, String>,
}

/// The tags that describe a volume.
///
/// # Errors
/// `InvalidArgument` when the record is too big for the tags of one LV.
pub fn for_volume(record: &VolumeRecord) -> Result<Vec<String>> {
    let tags = VolumeTags {
        n: record.name.clone(),
        node: record.node_id.clone(),
        p: record.parameters.clone(),
        t: record.created_at,
        s: record.content_source.clone(),
    };
    encode(VOLUME_TAG, &tags)
}

/// The tags that describe a snapshot.
///
/// # Errors
/// `InvalidArgument` when the record is too big for the tags of one LV.
pub fn for_snapshot(record: &SnapshotRecord) -> Result<Vec<String>> {
    let tags = SnapshotTags {
        n: record.name.clone(),
        v: record.source_volume_id.clone(),
        t: record.created_secs,
        ns: record.created_nanos,
        p: record.parameters.clone(),
    };
    encode(SNAPSHOT_TAG, &tags)
}

/// The volume record that the tags of LV `volume_id` of `size_bytes` describe; `None`
/// when they describe no volume.
///
/// # Errors
/// `Record`-like `Internal` error when the tags are damaged.
pub fn volume_from(
    volume_id: &str,
    size_bytes: u64,
    tags: &[String],
) -> Result<Option<VolumeRecord>> {
    if !tags.iter().any(|t| t == VOLUME_TAG) {
        return Ok(None);
    }
    let stored: VolumeTags = decode(volume_id, tags)?;
    Ok(Some(VolumeRecord {
        volume_id: volume_id.to_owned(),
        name: stored.n,
        capacity_bytes: size_bytes,
        node_id: stored.node,
        parameters: stored.p,
        created_at: stored.t,
        published: BTreeMap::new(),
        content_source: stored.s,
    }))
}

/// The snapshot record that the tags of LV `snapshot_id` describe; `None` when they
/// describe no snapshot.
///
/// # Errors
/// `Internal` when the tags are damaged.
pub fn snapshot_from(
    snapshot_id: &str,
    size_bytes: u64,
    tags: &[String],
) -> Result<Option<SnapshotRecord>> {
    if !tags.iter().any(|t| t == SNAPSHOT_TAG) {
        return Ok(None);
    }
    let stored: SnapshotTags = decode(snapshot_id, tags)?;
    Ok(Some(SnapshotRecord {
        snapshot_id: snapshot_id.to_owned(),
        name: stored.n,
        source_volume_id: stored.v,
        size_bytes,
        created_secs: stored.t,
        created_nanos: stored.ns,
        parameters: stored.p,
    }))
}

fn encode<T: Serialize>(kind: &str, value: &T) -> Result<Vec<String>> {
    let json = serde_json::to_vec(value)
        .map_err(|e| Error::Internal(format!("cannot encode a record: {e}")))?;
    let text = base64(&json);
    let parts: Vec<&str> = text
        .as_bytes()
        .chunks(PART_LEN)
        .map(|c| std::str::from_utf8(c).unwrap_or_default())
        .collect();
    if parts.len() > MAX_PARTS {
        return Err(Error::InvalidArgument(format!(
            "the volume's name and parameters take {} bytes, more than LV tags can hold",
            json.len()
        )));
    }
    let mut tags = vec![kind.to_owned()];
    tags.extend(
        parts
            .iter()
            .enumerate()
            .map(|(i, part)| format!("{PART_PREFIX}{i:02}={part}")),
    );
    Ok(tags)
}

fn decode<T: for<'de> Deserialize<'de>>(lv: &str, tags: &[String]) -> Result<T> {
    let mut parts: Vec<(&str, &str)> = tags
        .iter()
        .filter_map(|t| t.strip_prefix(PART_PREFIX))
        .filter_map(|t| t.split_once('='))
        .collect();
    parts.sort_unstable();
    let damaged = |why: String| Error::Internal(format!("the tags of LV {lv} are damaged: {why}"));
    for (i, (index, _)) in parts.iter().enumerate() {
        if *index != format!("{i:02}") {
            return Err(damaged(format!("part {i:02} is missing")));
        }
    }
    let text: String = parts.iter().map(|(_, part)| *part).collect();
    let json = unbase64(&text).ok_or_else(|| damaged("not base64".into()))?;
    serde_json::from_slice(&json).map_err(|e| damaged(e.to_string()))
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unbase64(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if text.len() % 4 != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for quad in text.chunks(4) {
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 {
            return None;
        }
        let mut n = 0u32;
        for &c in &quad[..4 - pad] {
            let value = ALPHABET.iter().position(|&a| a == c)?;
            n = (n << 6) | value as u32;
        }
        n <<= 6 * pad as u32;
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
        for len in 0..70 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(unbase64(&base64(&bytes)), Some(bytes));
        }
        assert_eq!(unbase64("Zm9"), None);
        assert_eq!(unbase64("Zm!v"), None);
    }

    fn volume(name: &str) -> VolumeRecord {
        VolumeRecord {
            volume_id: "fv-0".into(),
            name: name.into(),
            capacity_bytes: 4 << 20,
            node_id: "node-a".into(),
            parameters: [("deviceClass".to_owned(), "thin".to_owned())].into(),
            created_at: 1_700_000_000,
            published: BTreeMap::new(),
            content_source: Some(ContentSource::Snapshot {
                snapshot_id: "fvs-1".into(),
            }),
        }
    }

    #[test]
    fn volume_records_survive_the_tags() {
        // A name of every awkward kind, long enough to need several parts.
        let name = format!("pvc/ä\"{}'\n{}", "x".repeat(900), "é".repeat(200));
        let record = volume(&name);
        let tags = for_volume(&record).expect("fits");
        assert!(tags.len() > 2, "{} tags", tags.len());
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_+.-/=!:&#".contains(c);
        for tag in &tags {
            assert!(tag.len() <= 1024, "{} characters", tag.len());
            assert!(tag.chars().all(allowed), "{tag}");
        }
        let back = volume_from("fv-0", 4 << 20, &tags)
            .expect("decodes")
            .expect("a volume");
        assert_eq!(back, record);
        assert_eq!(snapshot_from("fv-0", 0, &tags).expect("no error"), None);
        // Order of tags is lvm's business (it sorts them): any order decodes.
        let mut shuffled = tags.clone();
        shuffled.reverse();
        assert_eq!(
            volume_from("fv-0", 4 << 20, &shuffled).expect("decodes"),
            Some(record)
        );
        // A lost part is reported, not guessed around.
        let mut damaged = tags.clone();
        damaged.remove(1);
        assert!(volume_from("fv-0", 4 << 20, &damaged).is_err());
    }

    #[test]
    fn snapshot_records_survive_the_tags() {
        let record = SnapshotRecord {
            snapshot_id: "fvs-1".into(),
            name: "snap".into(),
            source_volume_id: "fv-0".into(),
            size_bytes: 8 << 20,
            created_secs: 1_700_000_001,
            created_nanos: 123,
            parameters: BTreeMap::new(),
        };
        let tags = for_snapshot(&record).expect("fits");
        assert_eq!(tags[0], SNAPSHOT_TAG);
        assert_eq!(
            snapshot_from("fvs-1", 8 << 20, &tags).expect("decodes"),
            Some(record)
        );
        assert_eq!(
            volume_from("fvs-1", 8 << 20, &tags).expect("no error"),
            None
        );
    }

    #[test]
    fn oversized_records_are_refused() {
        let record = volume(&"y".repeat(80_000));
        assert!(matches!(
            for_volume(&record),
            Err(Error::InvalidArgument(_))
        ));
    }
}
