// A tiny Rust program that build-guest.sh compiles on the host (rustc, no cargo) and the
// smoke test runs inside the guest: proves host-built glibc Rust binaries run there and that
// what cargo test binaries rely on works (threads, child processes, loopback TCP, /proc, /tmp).
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;

fn check(what: &str, ok: bool) -> bool {
    println!("rust-check: {what}: {}", if ok { "ok" } else { "FAILED" });
    ok
}

fn main() {
    let mut ok = true;

    let worker = std::thread::spawn(|| (1..=10u64).product::<u64>());
    ok &= check("thread", worker.join().ok() == Some(3_628_800));

    let child = Command::new("sh").args(["-c", "exit 7"]).status();
    ok &= check("child process", child.ok().and_then(|s| s.code()) == Some(7));

    let tcp = (|| -> std::io::Result<String> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let server = std::thread::spawn(move || -> std::io::Result<()> {
            let (mut conn, _) = listener.accept()?;
            conn.write_all(b"pong")
        });
        let mut client = TcpStream::connect(("localhost", addr.port()))?;
        let mut reply = String::new();
        client.read_to_string(&mut reply)?;
        server.join().map_err(|_| std::io::Error::other("server thread panicked"))??;
        Ok(reply)
    })();
    ok &= check("loopback tcp via localhost", tcp.ok().as_deref() == Some("pong"));

    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    ok &= check("/proc/self/mountinfo", mounts.contains(" / "));

    let tmp = std::env::temp_dir().join(format!("rust-check-{}", std::process::id()));
    let io = std::fs::write(&tmp, b"data").and_then(|()| std::fs::read(&tmp));
    let _ = std::fs::remove_file(&tmp);
    ok &= check("temp file", io.ok().as_deref() == Some(&b"data"[..]));

    let mut map = std::collections::HashMap::new(); // seeds from getrandom
    map.insert("key", 1);
    ok &= check("random-seeded HashMap", map.get("key") == Some(&1));

    std::process::exit(if ok { 0 } else { 1 });
}
