//! Device classes: the volume groups (and thin pools) the lvm backend provisions from,
//! each picked by name with the StorageClass parameter `deviceClass`.

use serde::Deserialize;

use crate::error::{Error, Result};

/// The StorageClass parameter that picks a device class.
pub const DEVICE_CLASS_PARAMETER: &str = "deviceClass";

/// How a device class makes its volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClassKind {
    /// Linear LVs: space is allocated up front, no snapshots or clones.
    Linear,
    /// Thin LVs in a thin pool: space on write, thin snapshots and clones.
    Thin,
}

/// One device class as configured.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceClass {
    /// The name StorageClasses use in `deviceClass`.
    pub name: String,
    /// The volume group it provisions from.
    pub volume_group: String,
    /// Linear or thin.
    #[serde(rename = "type")]
    pub kind: ClassKind,
    /// For thin classes: the thin pool LV in the volume group.
    #[serde(default)]
    pub thin_pool: Option<String>,
    /// For thin classes: how many times the pool's size its volumes may promise in all
    /// (1.0, the default, promises no more than the pool holds).
    #[serde(default = "one")]
    pub overprovision_ratio: f64,
    /// The class for StorageClasses that name none.
    #[serde(default)]
    pub default: bool,
}

fn one() -> f64 {
    1.0
}

impl DeviceClass {
    /// The thin pool of a thin class.
    pub fn pool(&self) -> Option<&str> {
        match self.kind {
            ClassKind::Thin => self.thin_pool.as_deref(),
            ClassKind::Linear => None,
        }
    }
}

/// The lvm backend's settings: its device classes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LvmConfig {
    /// At least one; names unique; at most one default.
    pub device_classes: Vec<DeviceClass>,
}

/// Whether `name` is usable as an lvm VG or LV name.
fn lvm_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 127
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+_.-".contains(&b))
}

impl LvmConfig {
    /// Checks the classes: names unique, lvm names valid, a pool for every thin class, a
    /// ratio of at least 1, one default at most (the only class is the default anyway).
    ///
    /// # Errors
    /// `InvalidArgument` naming the first problem.
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidArgument(format!("lvm device classes: {why}")));
        if self.device_classes.is_empty() {
            return bad("at least one device class is needed".into());
        }
        for (i, class) in self.device_classes.iter().enumerate() {
            if class.name.is_empty() {
                return bad(format!("class {i} has no name"));
            }
            if self.device_classes[..i]
                .iter()
                .any(|c| c.name == class.name)
            {
                return bad(format!("class {:?} is defined twice", class.name));
            }
            if !lvm_name(&class.volume_group) {
                return bad(format!(
                    "class {:?}: {:?} is not a volume group name",
                    class.name, class.volume_group
                ));
            }
            match (class.kind, &class.thin_pool) {
                (ClassKind::Thin, None) => {
                    return bad(format!("thin class {:?} names no thinPool", class.name));
                }
                (ClassKind::Thin, Some(pool)) if !lvm_name(pool) => {
                    return bad(format!(
                        "class {:?}: {pool:?} is not an LV name",
                        class.name
                    ));
                }
                (ClassKind::Linear, Some(_)) => {
                    return bad(format!("linear class {:?} takes no thinPool", class.name));
                }
                _ => {}
            }
            if !(class.overprovision_ratio >= 1.0 && class.overprovision_ratio.is_finite()) {
                return bad(format!(
                    "class {:?}: overprovisionRatio must be a number of at least 1",
                    class.name
                ));
            }
            if class.kind == ClassKind::Linear && class.overprovision_ratio != 1.0 {
                return bad(format!(
                    "linear class {:?} cannot overprovision: its LVs are allocated up front",
                    class.name
                ));
            }
        }
        if self.device_classes.iter().filter(|c| c.default).count() > 1 {
            return bad("more than one class is the default".into());
        }
        Ok(())
    }

    /// The class a StorageClass's `deviceClass` names, or the default class when it names
    /// none (the one marked default, or the only one).
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown class, or no class named where there is no default.
    pub fn pick(&self, wanted: Option<&str>) -> Result<&DeviceClass> {
        match wanted {
            Some(name) => self
                .device_classes
                .iter()
                .find(|c| c.name == name)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "parameter {DEVICE_CLASS_PARAMETER}={:?} names no device class (configured: {})",
                        crate::validate::clip(name),
                        self.names()
                    ))
                }),
            None => self.default_class().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "parameter {DEVICE_CLASS_PARAMETER} is required: no device class is the default (configured: {})",
                    self.names()
                ))
            }),
        }
    }

    /// The default class, if there is one.
    pub fn default_class(&self) -> Option<&DeviceClass> {
        match self.device_classes.as_slice() {
            [only] => Some(only),
            all => all.iter().find(|c| c.default),
        }
    }

    fn names(&self) -> String {
        self.device_classes
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<LvmConfig> {
        let config: LvmConfig =
            serde_norway::from_str(yaml).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        config.check().map(|()| config)
    }

    #[test]
    fn classes_parse_and_pick() {
        let config = parse(
            "deviceClasses:\n\
             - {name: thin, volumeGroup: vg0, type: thin, thinPool: pool0, overprovisionRatio: 5, default: true}\n\
             - {name: fast, volumeGroup: vg-nvme, type: linear}\n",
        )
        .expect("valid");
        assert_eq!(config.pick(None).expect("default").name, "thin");
        assert_eq!(config.pick(Some("fast")).expect("named").pool(), None);
        assert_eq!(
            config.pick(Some("thin")).expect("named").pool(),
            Some("pool0")
        );
        assert!(config.pick(Some("slow")).is_err());
    }

    #[test]
    fn bad_classes_are_refused() {
        for yaml in [
            "deviceClasses: []",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: thin}]",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: linear, thinPool: p}]",
            "deviceClasses: [{name: a, volumeGroup: 'vg/0', type: linear}]",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: thin, thinPool: p, overprovisionRatio: 0.5}]",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: linear, overprovisionRatio: 2}]",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: linear}, {name: a, volumeGroup: vg1, type: linear}]",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: linear, default: true}, {name: b, volumeGroup: vg1, type: linear, default: true}]",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: striped}]",
            "deviceClasses: [{name: a, volumeGroup: vg0, type: linear, size: 3}]",
        ] {
            assert!(parse(yaml).is_err(), "{yaml}");
        }
        // Two classes and no default: a StorageClass must name one.
        let config = parse(
            "deviceClasses: [{name: a, volumeGroup: vg0, type: linear}, {name: b, volumeGroup: vg1, type: linear}]",
        )
        .expect("valid");
        assert!(config.pick(None).is_err());
    }
}
