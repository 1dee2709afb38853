//! The shape of the code, as scripts/architecture.py measures it: no circle among the files of a
//! folder, no cycle among the top-level modules, no arrow up the map of ARCHITECTURE.md, and small
//! functions and files. The script prints what it finds; a failure here shows that report.

use std::process::Command;

/// Runs `python3 scripts/architecture.py` with `args` from the repository's root: whether it
/// succeeded, and what it printed.
fn architecture(args: &[&str]) -> (bool, String) {
    let out = Command::new("python3")
        .arg("scripts/architecture.py")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("python3 (3.11 or later) runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

#[test]
fn the_code_keeps_its_architecture() {
    let (ok, report) = architecture(&[]);
    assert!(ok, "scripts/architecture.py found breaches:\n{report}");
}

/// The measure itself reads use trees, paths, re-exports, test code and the map as intended, on
/// small trees of its own.
#[test]
fn the_architecture_measure_passes_its_own_tests() {
    let (ok, output) = architecture(&["--self-test"]);
    assert!(ok, "scripts/architecture.py --self-test failed:\n{output}");
}
