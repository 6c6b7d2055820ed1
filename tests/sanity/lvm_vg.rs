//! The lvm backend under the suite: with `FERROVOL_SANITY_BACKEND=lvm` every test driver
//! runs `--backend lvm` on a volume group of its own, made on a loop device over a sparse
//! file in the test's temp dir, with a thin pool. That needs device-mapper, so it runs in
//! the LVM test guest (`tests/lvm.rs` boots it); the host runs the suite on the loop
//! backend.
//!
//! Device classes of every test VG: `thin` (the default, thin pool `pool`, overprovision
//! ratio 4) and `linear`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::host::run_tool;

/// Size of each test's volume group.
const VG_BYTES: u64 = 8 << 30;
/// Size of its thin pool (the rest stays free for the linear class).
const POOL_SIZE: &str = "4g";

/// Whether the suite runs against the lvm backend.
pub fn backend_is_lvm() -> bool {
    std::env::var("FERROVOL_SANITY_BACKEND").is_ok_and(|b| b == "lvm")
}

/// A volume group made for one test driver.
#[derive(Debug)]
pub struct TestVg {
    /// The VG's name.
    pub name: String,
    /// The loop device its one PV is on.
    loop_device: String,
    /// The sparse file behind it.
    image: PathBuf,
}

impl TestVg {
    /// Makes the VG and its thin pool in `root`, named after the temp dir.
    pub fn create(root: &Path) -> TestVg {
        let suffix: String = root
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("x")
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let name = format!("fvt{suffix}");
        let image = root.join("vg.img");
        File::create(&image)
            .and_then(|f| f.set_len(VG_BYTES))
            .unwrap_or_else(|e| panic!("create {}: {e}", image.display()));
        let loop_device = run_tool(
            "losetup",
            &["--find".as_ref(), "--show".as_ref(), image.as_os_str()],
        );
        run_tool("pvcreate", &["-q", "-y", &loop_device]);
        run_tool("vgcreate", &["-q", &name, &loop_device]);
        run_tool(
            "lvcreate",
            &["-q", "-y", "-T", "-L", POOL_SIZE, &format!("{name}/pool")],
        );
        TestVg {
            name,
            loop_device,
            image,
        }
    }

    /// The `--config` file's text for a driver on this VG.
    pub fn config_yaml(&self) -> String {
        format!(
            "backend: lvm\n\
             lvm:\n  deviceClasses:\n\
             \x20   - {{name: thin, volumeGroup: {vg}, type: thin, thinPool: pool, overprovisionRatio: 4, default: true}}\n\
             \x20   - {{name: linear, volumeGroup: {vg}, type: linear}}\n",
            vg = self.name
        )
    }

    /// LVs of the VG that are still open (mounted or held): leaks after a teardown.
    pub fn open_lvs(&self) -> Vec<String> {
        let attrs = run_tool(
            "lvs",
            &["--noheadings", "-o", "lv_name,lv_attr", &self.name],
        );
        attrs
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (name, attr) = (fields.next()?, fields.next()?);
                // The thin pool is always open (its volumes hold it): only ours count.
                (name.starts_with("fv") && attr.chars().nth(5) == Some('o'))
                    .then(|| format!("{}/{name}", self.name))
            })
            .collect()
    }

    /// The device-mapper node of LV `name` while it is active, with its `major:minor`.
    pub fn active_device(&self, name: &str) -> Option<(PathBuf, String)> {
        let out = Command::new("lvs")
            .args([
                "--noheadings",
                "-o",
                "lv_dm_path,lv_active,lv_kernel_major,lv_kernel_minor",
            ])
            .arg(format!("{}/{name}", self.name))
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<&str> = text.split_whitespace().collect();
        match fields.as_slice() {
            [path, "active", major, minor] => {
                Some((PathBuf::from(path), format!("{major}:{minor}")))
            }
            _ => None,
        }
    }

    /// Names of the VG's LVs.
    pub fn lv_names(&self) -> Vec<String> {
        run_tool("lvs", &["--noheadings", "-o", "lv_name", &self.name])
            .lines()
            .map(|l| l.trim().to_owned())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The size in bytes of LV `name`, `None` when there is none.
    pub fn lv_size(&self, name: &str) -> Option<u64> {
        let out = Command::new("lvs")
            .args([
                "--noheadings",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "lv_size",
            ])
            .arg(format!("{}/{name}", self.name))
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }

    /// Removes the VG, its PV and its loop device; returns what could not be undone.
    pub fn remove(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let steps: [(&str, Vec<&str>); 3] = [
            ("vgremove", vec!["-q", "-ff", "-y", &self.name]),
            ("pvremove", vec!["-q", "-ff", "-y", &self.loop_device]),
            ("losetup", vec!["-d", &self.loop_device]),
        ];
        for (program, args) in steps {
            match Command::new(program).args(&args).output() {
                Ok(out) if out.status.success() => {}
                Ok(out) => problems.push(format!(
                    "{program} {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => problems.push(format!("{program}: {e}")),
            }
        }
        let _ = std::fs::remove_file(&self.image);
        problems
    }
}
