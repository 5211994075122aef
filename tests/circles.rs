//! `scripts/check-circles`, the lint check that no two files of `src/` use each
//! other (even through others), nor two of its top-level modules: on small trees
//! with known circles it fails naming their arrows, and on `src/` it passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A source tree of these files under a fresh directory named `name`.
fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&root);
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    root
}

fn check(src: &Path) -> (Output, String) {
    let out = Command::new(repo().join("scripts/check-circles"))
        .arg(src)
        .output()
        .expect("scripts/check-circles runs (python3)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, stdout)
}

#[test]
fn a_circle_between_files_fails_with_every_arrow_named() {
    let root = tree(
        "circle-files",
        &[
            ("lib.rs", "pub mod p;\npub mod x;\n"),
            ("p/mod.rs", "pub mod a;\npub mod b;\n"),
            // p/a <-> p/b: a use one way, an inline path the other.
            ("p/a.rs", "use crate::p::b::B;\npub struct A(B);\n"),
            (
                "p/b.rs",
                "pub struct B;\npub fn f() -> usize { std::mem::size_of::<super::a::A>() }\n",
            ),
            // y -> z -> y, the way back through x's re-export of Y: re-exports hide
            // no circle.
            ("x/mod.rs", "pub mod y;\npub mod z;\npub use y::Y;\n"),
            ("x/y.rs", "use super::z::{Z, self};\npub struct Y(Z);\n"),
            ("x/z.rs", "use crate::x::{Y as Why};\npub struct Z;\n"),
        ],
    );
    let (out, stdout) = check(&root);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let src = root.display();
    for line in [
        format!("circle: {src}/p/a.rs {src}/p/b.rs"),
        format!("  {src}/p/a.rs -> {src}/p/b.rs   ({src}/p/a.rs:1)"),
        format!("  {src}/p/b.rs -> {src}/p/a.rs   ({src}/p/b.rs:2)"),
        format!("circle: {src}/x/y.rs {src}/x/z.rs"),
        format!("  {src}/x/y.rs -> {src}/x/z.rs   ({src}/x/y.rs:1)"),
        format!("  {src}/x/z.rs -> {src}/x/y.rs   ({src}/x/z.rs:1)"),
        "2 import circle(s)".to_owned(),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}");
    }
    // z's arrow goes through the re-export to y.rs, not to x/mod.rs (which uses
    // y.rs for it): no circle through x/mod.rs.
    assert!(!stdout.contains("mod.rs"), "{stdout}");
}

#[test]
fn a_circle_between_layers_fails_though_no_files_circle() {
    // objects.rs uses placement/pod.rs, placement/desired.rs uses objects.rs.
    let root = tree(
        "circle-layers",
        &[
            ("lib.rs", "pub mod objects;\npub mod placement;\n"),
            (
                "objects.rs",
                "pub struct Object;\npub fn view() -> crate::placement::pod::View { todo!() }\n",
            ),
            ("placement/mod.rs", "pub mod desired;\npub mod pod;\n"),
            ("placement/pod.rs", "pub struct View;\n"),
            (
                "placement/desired.rs",
                "use crate::objects::Object;\npub fn desired(_: &Object) {}\n",
            ),
        ],
    );
    let (out, stdout) = check(&root);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let src = root.display();
    for line in [
        "circle: objects placement".to_owned(),
        format!("  objects -> placement   ({src}/objects.rs:2)"),
        format!("  placement -> objects   ({src}/placement/desired.rs:1)"),
        "1 import circle(s)".to_owned(),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}");
    }
}

#[test]
fn test_code_and_one_way_arrows_make_no_circle() {
    let root = tree(
        "no-circle",
        &[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            ("a.rs", "use crate::b::B;\npub struct A(B);\n"),
            (
                "b.rs",
                "pub struct B; // crate::a::A in a comment\n\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
            ),
        ],
    );
    let (out, stdout) = check(&root);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("no import circles"), "{stdout}");
}

#[test]
fn src_has_no_import_circles() {
    let (out, stdout) = check(&repo().join("src"));
    assert!(
        out.status.success(),
        "scripts/check-circles src:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
