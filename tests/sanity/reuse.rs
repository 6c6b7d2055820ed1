//! A loop device detached behind the driver's back and then reused for another file.
//!
//! After `losetup -d`, the kernel hands the same `/dev/loopN` to the next attach, by any
//! process. A block target the driver published still holds a bind of that device node, so
//! it now reaches someone else's data. The driver must report the volume abnormal (not
//! serve the other file's size as its own), must still let the volume be unpublished and
//! unstaged, and must not treat the stale bind as a publication of the new owner.

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use crate::harness::Driver;
use crate::host::detach_loop_behind_back;
use crate::node::stats;
use crate::requests::{block_cap, MIB};

/// A foreign file attached to a chosen loop device; detached on drop.
struct ForeignAttach {
    device: PathBuf,
}

impl ForeignAttach {
    /// Attaches `file` to exactly `device`, as another program would.
    fn attach(device: &PathBuf, file: &PathBuf) -> Option<ForeignAttach> {
        let out = Command::new("losetup")
            .arg(device)
            .arg(file)
            .output()
            .expect("run losetup");
        out.status.success().then(|| ForeignAttach {
            device: device.clone(),
        })
    }
}

impl Drop for ForeignAttach {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_target_whose_loop_device_was_reused_is_abnormal_and_cleanable() {
    let d = Driver::start().await;
    let cap = block_cap();
    let vol = d.create("pvc-reused", 16 * MIB, cap.clone()).await;
    let id = vol.volume_id.clone();
    d.stage(&id, &cap).await;
    let target = d.publish(&id, &cap, "blk", false).await;
    let device = d.loop_of(&id).expect("loop device").device;

    let foreign_file = d.target_path("foreign.img");
    File::create(&foreign_file)
        .and_then(|f| f.set_len(8 * MIB as u64))
        .expect("foreign backing file");
    detach_loop_behind_back(&device);
    // Reuse the freed number for a file of our own. Tests run in parallel, so another test
    // may take the number first: that is the same scenario (someone else's file behind
    // the device), so either owner will do, as long as someone has it.
    let sys_backing = PathBuf::from(format!(
        "/sys/block/{}/loop/backing_file",
        device
            .file_name()
            .and_then(|n| n.to_str())
            .expect("loop device name")
    ));
    let owner = || {
        std::fs::read_to_string(&sys_backing)
            .ok()
            .map(|t| t.trim().to_owned())
    };
    let mut foreign = None;
    for _ in 0..50 {
        if owner().is_some() {
            break;
        }
        foreign = ForeignAttach::attach(&device, &foreign_file);
        if foreign.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let new_owner = owner().unwrap_or_else(|| panic!("{} was not reused", device.display()));
    assert!(
        !new_owner.contains(&id),
        "{} still serves the volume",
        device.display()
    );

    let cond = stats(&d, &id, &target)
        .await
        .volume_condition
        .expect("volume_condition");
    assert!(cond.abnormal, "reused loop device not reported: {cond:?}");
    assert!(
        cond.message.contains(&new_owner) || cond.message.contains("was detached"),
        "message names the new owner {new_owner}: {cond:?}"
    );

    d.unpublish(&id, &target).await;
    d.unstage(&id).await;
    d.delete(&id).await;
    drop(foreign);
    let _ = std::fs::remove_file(&foreign_file);
    d.finish().await;
}
