//! The documentation against what it documents: the PlacementPolicy field table of
//! `docs/contract.md` against the CRD berth generates (`berth crd`), in both
//! directions, and every relative link of `README.md` and `docs/*.md` against the
//! repository. A field added to the Rust types, or a file moved, fails here rather
//! than leaving the contract quietly wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One field of the CRD as the contract should describe it.
#[derive(Debug)]
struct Field {
    /// `string`, `integer`, `boolean`, `object`, `[]string`, or the Kubernetes type
    /// the schema is (`LabelSelector`, ...).
    ty: String,
    enumeration: Vec<String>,
    default: Option<String>,
    range: Option<String>,
}

/// The PlacementPolicy CRD from `berth crd` (which prints the StaticPlacement CRD
/// after it), as JSON.
fn generated_crd() -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("crd")
        .output()
        .expect("berth runs");
    assert!(
        out.status.success(),
        "berth crd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::Deserializer::from_slice(&out.stdout)
        .map(|doc| Value::deserialize(doc).expect("berth crd prints YAML"))
        .find(|crd| crd["metadata"]["name"] == "placementpolicies.berth.io")
        .expect("berth crd prints the PlacementPolicy CRD")
}

fn property_names(schema: &Value) -> BTreeSet<&str> {
    schema["properties"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Kubernetes' own types, recognised by their properties: the contract names them
/// rather than listing their fields, which are Kubernetes' to document.
fn kubernetes_type(schema: &Value, spec: &Value) -> Option<&'static str> {
    let names = property_names(schema);
    let is = |fields: &[&str]| names == fields.iter().copied().collect();
    if is(&["matchExpressions", "matchLabels"]) {
        Some("LabelSelector")
    } else if is(&["key", "operator", "values"]) {
        Some("NodeSelectorRequirement")
    } else if is(&[
        "lastTransitionTime",
        "message",
        "observedGeneration",
        "reason",
        "status",
        "type",
    ]) {
        Some("Condition")
    } else if schema["properties"] == spec["properties"] {
        // status.lastGoodSpec: the spec again.
        Some("PlacementPolicySpec")
    } else {
        None
    }
}

/// A number as written in the contract: `50`, not `50.0`.
fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// The type of `schema`, and whether its fields are berth's to list.
fn type_of(schema: &Value, spec: &Value) -> (String, bool) {
    if let Some(k8s) = kubernetes_type(schema, spec) {
        return (k8s.to_string(), false);
    }
    match schema["type"].as_str() {
        Some("array") => {
            let (item, descend) = type_of(&schema["items"], spec);
            (format!("[]{item}"), descend)
        }
        Some("object") => ("object".into(), schema["properties"].is_object()),
        Some(other) => (other.to_string(), false),
        None => ("<untyped>".into(), false),
    }
}

/// Every field below `schema`, by dotted path (`[]` for list items).
fn walk(schema: &Value, path: &str, spec: &Value, out: &mut BTreeMap<String, Field>) {
    let Some(properties) = schema["properties"].as_object() else {
        return;
    };
    for (name, property) in properties {
        let path = format!("{path}.{name}");
        let (ty, descend) = type_of(property, spec);
        let range = match (property.get("minimum"), property.get("maximum")) {
            (Some(min), Some(max)) => Some(format!("{}..{}", plain(min), plain(max))),
            _ => None,
        };
        out.insert(
            path.clone(),
            Field {
                ty,
                enumeration: property["enum"]
                    .as_array()
                    .map(|e| e.iter().map(plain).collect())
                    .unwrap_or_default(),
                default: property.get("default").map(plain),
                range,
            },
        );
        if descend {
            match property["type"].as_str() {
                Some("array") => walk(&property["items"], &format!("{path}[]"), spec, out),
                _ => walk(property, &path, spec, out),
            }
        }
    }
}

/// The fields of the generated CRD's `spec` and `status`.
fn crd_fields() -> BTreeMap<String, Field> {
    let crd = generated_crd();
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    assert_eq!(versions.len(), 1, "the contract documents one version");
    let root = &versions[0]["schema"]["openAPIV3Schema"];
    let spec = &root["properties"]["spec"];
    let mut fields = BTreeMap::new();
    for top in ["spec", "status"] {
        walk(&root["properties"][top], top, spec, &mut fields);
    }
    assert!(fields.len() > 20, "the schema walk found only {fields:?}");
    fields
}

/// The rows of the field table in the contract's "PlacementPolicy" section: path,
/// type cell, and the whole row (for enum values and defaults in the meaning).
fn documented_fields(contract: &str) -> BTreeMap<String, (String, String)> {
    let mut in_section = false;
    let mut rows = BTreeMap::new();
    for line in contract.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            in_section = heading.trim() == "PlacementPolicy";
            continue;
        }
        if !in_section || !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let path = cells[1].trim_matches('`').to_string();
        if !(path.starts_with("spec.") || path.starts_with("status.")) {
            continue;
        }
        let previous = rows.insert(path.clone(), (cells[2].to_string(), line.to_string()));
        assert!(previous.is_none(), "docs/contract.md lists {path} twice");
    }
    rows
}

#[test]
fn the_contract_lists_every_placementpolicy_field_berth_generates_and_no_other() {
    let contract = read(&repo().join("docs/contract.md"));
    let documented = documented_fields(&contract);
    let generated = crd_fields();
    let mut problems = Vec::new();

    for (path, field) in &generated {
        let Some((ty, row)) = documented.get(path) else {
            problems.push(format!(
                "docs/contract.md does not document {path} ({}), which `berth crd` generates: \
                 add a row to the PlacementPolicy table",
                field.ty
            ));
            continue;
        };
        // The type cell begins with the type: "string: `A` or `B`, default `A`".
        let documented_type = ty.split([',', ':']).next().unwrap_or_default().trim();
        if documented_type != field.ty {
            problems.push(format!(
                "{path}: the contract says type {documented_type:?}, the CRD has {:?}",
                field.ty
            ));
        }
        for value in &field.enumeration {
            if !ty.contains(&format!("`{value}`")) {
                problems.push(format!(
                    "{path}: the CRD allows {value:?}, which the type cell does not name"
                ));
            }
        }
        if let Some(default) = &field.default
            && !row.contains(&format!("default `{default}`"))
        {
            problems.push(format!(
                "{path}: the CRD's default is {default}, which the row does not give as default `{default}`"
            ));
        }
        if let Some(range) = &field.range
            && !ty.contains(range.as_str())
        {
            problems.push(format!(
                "{path}: the CRD allows {range}, which the type cell does not say"
            ));
        }
    }
    for path in documented.keys() {
        if !generated.contains_key(path) {
            problems.push(format!(
                "docs/contract.md documents {path}, which the CRD from `berth crd` does not have"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The headings of a Markdown file as GitHub anchors them (lowercase, punctuation
/// dropped, spaces as `-`, a repeated heading numbered).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    // Code in a heading is part of its anchor.
    for line in outside_fences(markdown) {
        if !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#').trim().to_lowercase();
        let slug: String = text
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_default();
        anchors.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// The lines of a Markdown file outside fenced code blocks.
fn outside_fences(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push(line);
        }
    }
    lines
}

/// The lines of a Markdown file outside fenced code blocks, with inline code spans
/// blanked (a link shown as code is not a link).
fn outside_code(markdown: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for line in outside_fences(markdown) {
        let mut kept = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                kept.push_str(part);
            } else {
                kept.push_str(&" ".repeat(part.len() + 2));
            }
        }
        lines.push(kept);
    }
    lines
}

/// The targets of the inline links (`[text](target)`, images too) and reference
/// definitions (`[label]: target`) of a Markdown file.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in outside_code(markdown) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            // `[text](target "title")`: the target is the first word.
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            targets.push(target.trim_matches(['<', '>']).to_string());
            rest = &after[end..];
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some((label, target)) = trimmed.split_once("]:")
            && !label.contains("](")
        {
            targets.push(target.split_whitespace().next().unwrap_or_default().into());
        }
    }
    targets
}

/// `path` with `.` and `..` resolved lexically; `None` when it climbs above its root.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[test]
fn every_relative_link_in_the_readme_and_docs_points_into_the_repository() {
    let root = repo();
    let mut files = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(&root).unwrap().to_path_buf())
        .collect();
    docs.sort();
    for required in ["contract.md", "operator-guide.md", "security-model.md"] {
        assert!(
            docs.contains(&Path::new("docs").join(required)),
            "docs/{required} is missing"
        );
    }
    files.extend(docs);

    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = read(&root.join(file));
        for target in link_targets(&text) {
            let scheme = target.split_once(':').map(|(s, _)| s);
            if scheme.is_some_and(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic())) {
                continue; // https:, mailto: and the like: not the repository's to check
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                Some(file.clone())
            } else {
                normalise(&file.parent().unwrap().join(path))
            };
            let Some(linked) = linked else {
                problems.push(format!(
                    "{}: link {target} leads outside the repository",
                    file.display()
                ));
                continue;
            };
            if !root.join(&linked).exists() {
                problems.push(format!(
                    "{}: link {target} points at {}, which does not exist",
                    file.display(),
                    linked.display()
                ));
                continue;
            }
            if let Some(anchor) = anchor
                && linked.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&root.join(&linked))).contains(anchor)
            {
                problems.push(format!(
                    "{}: link {target}: {} has no heading #{anchor}",
                    file.display(),
                    linked.display()
                ));
            }
        }
    }
    assert!(
        checked > 0,
        "no relative link found: is the link parser broken?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The link checker finds links, including the ones it must refuse.
#[test]
fn the_link_parser_reads_inline_and_reference_links_but_not_code() {
    let text = "See [a](docs/a.md#x) and ![img](i.png \"t\").\n\
                `[not](a-link.md)`\n\
                ```\n[nor](this.md)\n```\n\
                [ref]: ../outside.md\n";
    assert_eq!(
        link_targets(text),
        ["docs/a.md#x", "i.png", "../outside.md"]
    );
    assert_eq!(
        normalise(Path::new("docs/../README.md")),
        Some("README.md".into())
    );
    assert_eq!(normalise(Path::new("../shared/SPEC.md")), None);
    assert!(anchors("## Groups: all-or-nothing, `x`\n").contains("groups-all-or-nothing-x"));
}

/// The flags of `berth serve`, as the contract's table lists them.
fn documented_serve_flags(contract: &str) -> BTreeSet<String> {
    let start = contract
        .find("**`berth serve`**")
        .expect("the contract describes berth serve");
    contract[start..]
        .lines()
        .skip_while(|line| !line.starts_with("| flag |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .flat_map(|line| {
            let first = line.split('|').nth(1).unwrap_or_default();
            first
                .split(',')
                .map(|flag| flag.trim().trim_matches('`').to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_contract_lists_every_flag_of_berth_serve_and_no_other() {
    use clap::CommandFactory;
    let command = berth::cli::Cli::command();
    let serve = command
        .find_subcommand("serve")
        .expect("berth has a serve command");
    let flags: BTreeSet<String> = serve
        .get_arguments()
        .filter_map(|arg| arg.get_long())
        .filter(|long| *long != "help")
        .map(|long| format!("--{long}"))
        .collect();
    let documented = documented_serve_flags(&read(&repo().join("docs/contract.md")));
    assert_eq!(
        documented, flags,
        "docs/contract.md's table of `berth serve` flags and `berth serve --help` differ"
    );
}

/// The image the tests build without a container engine (`tests/cluster/berth-image`,
/// loaded into a real node by `load-image`) has the Dockerfile's binary path, user,
/// entrypoint, command and ports: the release image and the tested one are the same.
#[test]
fn the_tests_image_is_the_dockerfiles() {
    let dockerfile = read(&repo().join("Dockerfile"));
    // The final stage: from its FROM line on.
    let stage = dockerfile
        .rsplit_once("\nFROM ")
        .map(|(_, s)| s)
        .expect("a final stage");
    let instruction = |name: &str| -> String {
        stage
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in the Dockerfile's final stage"))
            .trim()
            .to_owned()
    };
    let copied = instruction("COPY");
    let binary = copied.split_whitespace().last().unwrap().to_owned();
    let json_list = |text: String| -> Vec<String> {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
    };
    let ports: BTreeSet<String> = instruction("EXPOSE")
        .split_whitespace()
        .map(|p| format!("{p}/tcp"))
        .collect();

    let dir = tempdir("image");
    let fake = dir.join("berth");
    std::fs::write(&fake, b"not a real binary").unwrap();
    let tar = dir.join("berth.tar");
    let out = Command::new(repo().join("tests/cluster/berth-image"))
        .arg(&tar)
        .arg("check")
        .arg(&fake)
        .output()
        .expect("run berth-image");
    assert!(
        out.status.success(),
        "berth-image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The image's config blob, and the layer's file list, from the OCI layout.
    let listing = Command::new("tar").arg("-tf").arg(&tar).output().unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let blobs: Vec<Vec<u8>> = listing
        .lines()
        .filter(|l| l.starts_with("blobs/sha256/"))
        .map(|l| {
            Command::new("tar")
                .arg("-xOf")
                .arg(&tar)
                .arg(l)
                .output()
                .unwrap()
                .stdout
        })
        .collect();
    let config: Value = blobs
        .iter()
        .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
        .find(|v| v.get("rootfs").is_some())
        .expect("an image config");
    let config = &config["config"];
    assert_eq!(config["User"], instruction("USER"), "user");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(json_list(instruction("ENTRYPOINT"))),
        "entrypoint"
    );
    assert_eq!(
        config["Cmd"],
        serde_json::json!(json_list(instruction("CMD"))),
        "command"
    );
    let exposed: BTreeSet<String> = config["ExposedPorts"]
        .as_object()
        .expect("exposed ports")
        .keys()
        .cloned()
        .collect();
    assert_eq!(exposed, ports, "ports");
    assert_eq!(
        config["Entrypoint"][0].as_str(),
        Some(binary.as_str()),
        "the entrypoint is the binary the Dockerfile copies"
    );
    // The binary is at that path in the layer, and there is no shell.
    let layer = blobs
        .iter()
        .find(|b| b.starts_with(&[0x1f, 0x8b]))
        .expect("a gzipped layer");
    let layer_path = dir.join("layer.tar.gz");
    std::fs::write(&layer_path, layer).unwrap();
    let files = Command::new("tar")
        .arg("-tzf")
        .arg(&layer_path)
        .output()
        .unwrap();
    let files = String::from_utf8_lossy(&files.stdout).into_owned();
    assert!(
        files.lines().any(|f| f == binary.trim_start_matches('/')),
        "{binary} in the layer: {files}"
    );
    assert!(
        !files.lines().any(|f| f.ends_with("bin/sh")),
        "a shell in the image: {files}"
    );
}

/// A fresh folder under target/ for one test.
fn tempdir(purpose: &str) -> PathBuf {
    let dir = repo()
        .join("target/test-docs")
        .join(format!("{purpose}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
