//! Installing never crashes a running server: `scripts/install.sh` builds
//! first and then renames each file over the installed one, so the library
//! a server has mapped (or maps while the install runs) is never written in
//! place. Watched with inotify while the install places the staged build.
#![cfg(feature = "integration")]

mod common;

use common::pg_config;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[test]
fn install_never_writes_the_installed_library_in_place() {
    let libdir = pg_config("--pkglibdir");
    let mut watcher = Command::new("inotifywait")
        .args(["-m", "-e", "modify,close_write,moved_to,create", "--format", "%e %f", &libdir])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("inotifywait (Debian package inotify-tools) runs");
    // It says so on stderr once its watch is in place.
    let mut stderr = BufReader::new(watcher.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("Watches established") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "inotifywait ended before watching");
    }

    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("bash")
        .arg(repo.join("scripts/install.sh"))
        .arg("--place-only")
        .env("PG_CONFIG", std::env::var("LITEBASE_STREAMS_PG_CONFIG").unwrap())
        .status()
        .expect("scripts/install.sh runs");
    assert!(status.success(), "scripts/install.sh --place-only succeeds");

    watcher.kill().unwrap();
    let events: Vec<String> = BufReader::new(watcher.stdout.take().unwrap()).lines().map_while(Result::ok).collect();
    watcher.wait().unwrap();
    let on_library: Vec<&String> = events.iter().filter(|e| e.ends_with(" litebase_streams.so")).collect();
    assert!(on_library.iter().any(|e| e.starts_with("MOVED_TO")), "the new library is renamed into place: {events:?}");
    assert!(
        on_library.iter().all(|e| e.starts_with("MOVED_TO")),
        "the installed library is never created or written in place: {on_library:?}"
    );
}
