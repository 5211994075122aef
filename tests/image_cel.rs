//! The image matching of berth's admission policy (`berth::policy::image_cel`)
//! against berth's own (`ImageRef`, `ImagePatterns`): the RE2 regex for the
//! globs, read by Rust's regex crate, on generated globs and strings; and, in the
//! oracle tier (`--features oracle`), the CEL normaliser and the regex run by
//! cel-go in Kubernetes' CEL environment (the oracle, tests/cluster/oracle) on
//! thousands of generated images.

use std::cell::Cell;

use berth::policy::image_cel::{LONGEST_DECIDED, decided_images_regex, glob_regex};
use berth::policy::{ImagePatterns, ImageRef};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use regex::Regex;

/// Images as real clusters name them: every one must be decided in CEL.
const REALISTIC: &[&str] = &[
    "nginx",
    "nginx:1.27",
    "nginx:1.27-alpine",
    "library/nginx",
    "docker.io/nginx",
    "docker.io/library/nginx:latest",
    "index.docker.io/library/nginx:1.27",
    "bitnami/redis:7.2.4-debian-12-r0",
    "ghcr.io/org/app:v1",
    "quay.io/prometheus/node-exporter:v1.8.1",
    "registry.k8s.io/pause:3.10",
    "registry.k8s.io/ingress-nginx/controller:v1.11.2",
    "gcr.io/distroless/static-debian12:nonroot",
    "us-docker.pkg.dev/my-project/repo/app:2024.06.01",
    "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/service:git-3f2a9c1",
    "mcr.microsoft.com/dotnet/aspnet:8.0",
    "localhost/x",
    "localhost:5000/cdn/app",
    "registry.example.com:5000/cdn/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "nginx:1.27@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    "app:Release_Candidate.1",
    "my_registry.local/team__x/app-name.v2:RC1",
];

#[test]
fn realistic_images_are_decided() {
    let decided = Regex::new(&decided_images_regex()).unwrap();
    for image in REALISTIC {
        assert!(image.len() <= LONGEST_DECIDED, "{image}");
        assert!(decided.is_match(image), "{image}");
    }
}

/// Strings near the reference grammar: mostly right components, ports, tags
/// and digests, some wrong, sometimes too long, with a character sometimes
/// changed.
fn arb_image() -> impl Strategy<Value = String> {
    let hex64 = "0123456789abcdef".repeat(4);
    let registry = prop::sample::select(vec![
        "",
        "",
        "",
        "docker.io/",
        "index.docker.io/",
        "localhost/",
        "localhost:5000/",
        "registry.example.com:5000/",
        "ghcr.io/",
        "Ghcr.io/",
        "foo_bar.com/",
        "docker.io:443/",
        "a-b.c/",
        "-a.b/",
        "x:y/",
    ]);
    let component = prop_oneof![
        4 => "[a-z0-9]{1,5}(([._]|__|-{1,2})[a-z0-9]{1,3})?",
        1 => "[a-z0-9]{1,3}[._-]{1,2}[a-z0-9A-Z]{0,3}",
    ];
    let path = prop::collection::vec(component, 1..4).prop_map(|c| c.join("/"));
    let tag = prop_oneof![
        4 => Just(String::new()),
        4 => ":[A-Za-z0-9_][A-Za-z0-9_.-]{0,6}",
        1 => ":[.-][a-z]{0,3}",
        1 => Just(format!(":{}", "t".repeat(128))),
        1 => Just(format!(":{}", "t".repeat(129))),
    ];
    let digest = prop_oneof![
        8 => Just(String::new()),
        3 => Just(format!("@sha256:{hex64}")),
        1 => Just(format!("@sha256:{}", hex64.to_uppercase())),
        1 => Just(format!("@sha256:{}", &hex64[1..])),
        1 => Just(format!("@sha512:{hex64}{hex64}")),
        1 => Just(format!("@sha384:{hex64}{}", &hex64[..32])),
        1 => Just(format!("@md5:{}", &hex64[..32])),
    ];
    let long = prop_oneof![
        8 => Just(String::new()),
        1 => (225..260usize).prop_map(|n| format!("/{}", "n".repeat(n))),
    ];
    let change = prop::option::weighted(0.15, (any::<Index>(), "[A-Z:@/._ \\n\u{e9}-]"));
    (registry, path, long, tag, digest, change).prop_map(
        |(registry, path, long, tag, digest, change)| {
            let mut image = format!("{registry}{path}{long}{tag}{digest}");
            if let Some((at, with)) = change {
                let at = at.index(image.chars().count());
                let (byte, c) = image.char_indices().nth(at).unwrap();
                image.replace_range(byte..byte + c.len_utf8(), &with);
            }
            image
        },
    )
}

/// Images at oci-spec's length limit (a repository of 255 characters) and
/// [`LONGEST_DECIDED`].
fn long_images() -> Vec<String> {
    let n = |count: usize| "n".repeat(count);
    (244..=249)
        .flat_map(|len| {
            [
                n(len),
                format!("{}:t", n(len)),
                format!("a/{}", n(len - 2)),
                format!("docker.io/{}", n(len - 10)),
                format!("x.io/{}", n(len - 5)),
            ]
        })
        .collect()
}

proptest! {
    #![proptest_config(Config { cases: 1000, failure_persistence: None, ..Config::default() })]
    /// Every decided image is a reference oci-spec parses, so its normal form
    /// is what the CEL builds, never the string kept as written.
    #[test]
    fn decided_images_are_references(image in arb_image()) {
        let decided = Regex::new(&decided_images_regex()).unwrap();
        if image.len() <= LONGEST_DECIDED && decided.is_match(&image) {
            prop_assert!(image.parse::<oci_spec::distribution::Reference>().is_ok());
        }
    }
}

/// A glob, and a string its pieces would match (later mutated), built together.
fn arb_glob() -> impl Strategy<Value = (String, String)> {
    let any_char = "[abc/:.@_ \\-\u{e9}\\n]";
    let piece = prop_oneof![
        4 => "[abc/:.@_-]".prop_map(|c| (c.clone(), c)),
        1 => prop::sample::select(vec![
            ("\\*", "*"), ("\\?", "?"), ("\\[", "["), ("\\{", "{"), ("\\\\", "\\"),
            ("\\]", "]"), ("^", "^"), ("$", "$"), ("(", "("), ("+", "+"), ("|", "|"),
        ])
        .prop_map(|(g, s)| (g.to_owned(), s.to_owned())),
        2 => any_char.prop_map(|s| ("?".to_owned(), s)),
        2 => prop::collection::vec(any_char, 0..4).prop_map(|s| ("*".to_owned(), s.concat())),
        1 => prop::collection::vec(any_char, 0..4).prop_map(|s| ("**".to_owned(), s.concat())),
        1 => prop::sample::select(vec!["/", "/a/", "/a/b/", "//"])
            .prop_map(|s| ("/**/".to_owned(), s.to_owned())),
        1 => prop::sample::select(vec!["a", "b", "c", "d", "-", "/"])
            .prop_map(|s| ("[a-c]".to_owned(), s.to_owned())),
        1 => prop::sample::select(vec!["x", "y", "/", "\u{e9}", "\n"])
            .prop_map(|s| ("[!x]".to_owned(), s.to_owned())),
        1 => prop::sample::select(vec!["^", "a", "-", "]", "b"])
            .prop_map(|s| ("[]^-]".to_owned(), s.to_owned())),
        1 => prop::sample::select(vec!["ab", "c", "", "abc"])
            .prop_map(|s| ("{ab,c}".to_owned(), s.to_owned())),
        1 => prop::sample::select(vec!["a", "", "b"])
            .prop_map(|s| ("{a,}".to_owned(), s.to_owned())),
    ];
    prop::collection::vec(piece, 1..7).prop_map(|pieces| {
        pieces
            .into_iter()
            .fold((String::new(), String::new()), |(g, s), (pg, ps)| {
                (g + &pg, s + &ps)
            })
    })
}

/// A glob written for an image: its normalised form with a span made a
/// wildcard (or nothing), the rest escaped; and the image as written.
fn arb_image_glob() -> impl Strategy<Value = (String, String)> {
    let wild = prop::sample::select(vec!["*", "?", "**", ""]);
    (arb_image(), any::<Index>(), any::<Index>(), wild).prop_map(|(image, a, b, wild)| {
        let normalised: Vec<char> = ImageRef::new(&image).normalised.chars().collect();
        let (a, b) = (a.index(normalised.len() + 1), b.index(normalised.len() + 1));
        let literal = |chars: &[char]| -> String {
            chars
                .iter()
                .map(|&c| match c {
                    '*' | '?' | '[' | ']' | '{' | '}' | '\\' => format!("\\{c}"),
                    c => c.to_string(),
                })
                .collect()
        };
        let glob = format!(
            "{}{wild}{}",
            literal(&normalised[..a.min(b)]),
            literal(&normalised[a.max(b)..])
        );
        (glob, image)
    })
}

/// Globs and what to match them against.
#[derive(Debug, Clone)]
struct Case {
    patterns: Vec<String>,
    /// Strings matched as normalised references: each glob's own instance (some
    /// mutated) and the normalised images.
    subjects: Vec<String>,
    /// Images as written, one of them the image a glob was written for (for
    /// the CEL normaliser in the oracle tier).
    #[cfg_attr(not(feature = "oracle"), allow(dead_code))]
    images: Vec<String>,
}

fn arb_case() -> impl Strategy<Value = Case> {
    let mutate = (any::<Index>(), "[abc/:.\u{e9}]?");
    (
        prop::collection::vec((arb_glob(), prop::option::of(mutate)), 1..4),
        prop::option::weighted(0.7, arb_image_glob()),
        prop::collection::vec(arb_image(), 1..4),
    )
        .prop_map(|(globs, image_glob, mut images)| {
            let mut patterns = Vec::new();
            let mut subjects = Vec::new();
            for ((glob, mut subject), mutation) in globs {
                if let Some((at, with)) = mutation {
                    let at = at.index(subject.chars().count() + 1);
                    let byte = subject
                        .char_indices()
                        .nth(at)
                        .map_or(subject.len(), |c| c.0);
                    let end = subject[byte..]
                        .chars()
                        .next()
                        .map_or(byte, |c| byte + c.len_utf8());
                    subject.replace_range(byte..end, &with);
                }
                patterns.push(glob);
                subjects.push(subject);
            }
            if let Some((glob, image)) = image_glob {
                patterns.insert(0, glob);
                images.push(image);
            }
            subjects.extend(images.iter().map(|i| ImageRef::new(i).normalised));
            Case {
                patterns,
                subjects,
                images,
            }
        })
}

/// Whether berth's globs match `subject` taken as a normalised reference, and
/// the string is ASCII (the regex promises no more; the CEL normaliser yields
/// nothing else).
fn berth_matches(set: &ImagePatterns, subject: &str) -> bool {
    let image = ImageRef {
        written: subject.to_owned(),
        normalised: subject.to_owned(),
    };
    subject.is_ascii() && set.first_match(&image).is_some()
}

/// Whether the regex's answer `regex_matches` for `subject` is berth's; but
/// where globset sees no file name, in a string whose last `/` component is
/// `..` (never a reference), berth can miss what the regex matches (see
/// `glob_regex`).
fn regex_agrees(set: &ImagePatterns, subject: &str, regex_matches: bool) -> bool {
    let berth = berth_matches(set, subject);
    if subject == ".." || subject.ends_with("/..") {
        !berth || regex_matches
    } else {
        berth == regex_matches
    }
}

/// The patterns compiled and the regex for them; `None` when berth refuses the
/// globs, or the regex rightly does (a glob outside printable ASCII).
fn compiled(patterns: &[String]) -> Result<Option<(ImagePatterns, String)>, String> {
    let Ok(set) = ImagePatterns::new(patterns) else {
        return Ok(None);
    };
    let printable = patterns
        .iter()
        .all(|p| p.bytes().all(|b| (b' '..=b'~').contains(&b)));
    match (glob_regex(&set), printable) {
        (Ok(regex), true) => Ok(Some((set, regex))),
        (Err(_), false) => Ok(None),
        (answer, _) => Err(format!("{patterns:?}: {answer:?}")),
    }
}

/// The RE2 regex, read by Rust's regex crate in its (Unicode, character)
/// mode, which for this syntax is RE2's meaning; the oracle tier below runs it
/// in cel-go itself.
#[test]
fn the_regex_matches_what_the_globs_match() {
    let (matched, missed, refused) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let config = Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new(config)
        .run(&arb_case(), |case| {
            let Some((set, regex)) = compiled(&case.patterns).map_err(TestCaseError::fail)? else {
                refused.set(refused.get() + 1);
                return Ok(());
            };
            let re2 = Regex::new(&regex).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for subject in &case.subjects {
                let counter = if berth_matches(&set, subject) {
                    &matched
                } else {
                    &missed
                };
                counter.set(counter.get() + 1);
                prop_assert!(
                    regex_agrees(&set, subject, re2.is_match(subject)),
                    "globs {:?} regex {} subject {:?}",
                    case.patterns,
                    regex,
                    subject
                );
            }
            Ok(())
        })
        .unwrap();
    // The generator is worth something: both answers, often.
    assert!(matched.get() > 1000, "{} matched", matched.get());
    assert!(missed.get() > 1000, "{} missed", missed.get());
    assert!(refused.get() < 400, "{} cases refused", refused.get());
}

// Only the oracle's client of the differential tests' parts.
#[cfg(feature = "oracle")]
#[allow(dead_code)]
#[path = "differential/oracle.rs"]
mod oracle;

/// The CEL itself, run by cel-go in the environment admission policies run in.
#[cfg(feature = "oracle")]
mod in_cel {
    use berth::policy::image_cel::{CANNOT_TELL, cel_string, normalised_image_cel};
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{RngAlgorithm, TestRng};
    use serde_json::{Value, json};

    use super::*;

    use super::oracle::Oracle;

    /// `count` values of `strategy` from a fixed seed, so that a failure repeats.
    fn generated<S: Strategy>(strategy: S, count: usize) -> Vec<S::Value> {
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[44; 32]);
        let mut runner = TestRunner::new_with_rng(Config::default(), rng);
        (0..count)
            .map(|_| strategy.new_tree(&mut runner).expect("a value").current())
            .collect()
    }

    /// The strings a CEL expression over the list variable `list` yields.
    fn strings(oracle: &mut Oracle, expression: &str, variables: Value) -> Vec<Value> {
        let value = oracle
            .cel(expression, &variables)
            .unwrap_or_else(|e| panic!("{expression}: {e}"));
        value.as_array().expect("a list").clone()
    }

    #[test]
    fn cel_normalises_images_as_berth_does() {
        let mut oracle = Oracle::start();
        let images: Vec<String> = REALISTIC
            .iter()
            .map(|i| i.to_string())
            .chain(long_images())
            .chain(generated(arb_image(), 4000))
            .collect();
        let expression = format!("images.map(i, {})", normalised_image_cel("i"));
        let mut undecided = Vec::new();
        for batch in images.chunks(100) {
            let answers = strings(&mut oracle, &expression, json!({ "images": batch }));
            assert_eq!(answers.len(), batch.len(), "one answer an image");
            for (image, answer) in batch.iter().zip(answers) {
                let cel = answer.as_str().expect("a string");
                if cel == CANNOT_TELL {
                    undecided.push(image.clone());
                } else {
                    assert_eq!(cel, ImageRef::new(image).normalised, "{image:?}");
                }
            }
        }
        for image in REALISTIC {
            assert!(!undecided.iter().any(|u| u == image), "{image} undecided");
        }
        // Both sides of the subset were tried, often.
        let decided = images.len() - undecided.len();
        eprintln!("{decided} of {} images decided in CEL", images.len());
        assert!(decided > images.len() / 4, "{decided} decided");
        assert!(undecided.len() > images.len() / 10, "{undecided:?}");
    }

    #[test]
    fn cel_matches_images_to_globs_as_berth_does() {
        let mut oracle = Oracle::start();
        let (mut matched, mut missed) = (0, 0);
        for case in generated(arb_case(), 600) {
            let Some((set, regex)) = compiled(&case.patterns).unwrap() else {
                continue;
            };
            let regex = cel_string(&regex);
            let expressions = [
                format!("subjects.map(s, s.matches({regex}))"),
                format!(
                    "images.map(i, {}).map(n, [n, n.matches({regex}) ? 'match' : 'miss'])",
                    normalised_image_cel("i")
                ),
            ];
            let variables = json!({"subjects": case.subjects, "images": case.images});
            let answers: Vec<Vec<Value>> = oracle
                .cel_many(&expressions, &variables)
                .into_iter()
                .map(|answer| {
                    let answer = answer.unwrap_or_else(|e| panic!("{:?}: {e}", case.patterns));
                    answer.as_array().expect("a list").clone()
                })
                .collect();
            let [subjects, images] = &answers[..] else {
                panic!("two answers");
            };
            assert_eq!(subjects.len(), case.subjects.len());
            assert_eq!(images.len(), case.images.len());
            for (subject, answer) in case.subjects.iter().zip(subjects) {
                let cel = answer.as_bool().expect("a bool");
                assert!(
                    regex_agrees(&set, subject, cel),
                    "{case:?} {regex} {subject:?}: {cel}"
                );
            }
            for (image, answer) in case.images.iter().zip(images) {
                let [normalised, cel_matches] = &answer.as_array().expect("a pair")[..] else {
                    panic!("a pair");
                };
                if normalised.as_str() == Some(CANNOT_TELL) {
                    continue;
                }
                let berth = set.first_match(&ImageRef::new(image)).is_some();
                assert_eq!(
                    cel_matches,
                    if berth { "match" } else { "miss" },
                    "{case:?} {regex} {image:?}"
                );
                if berth {
                    matched += 1;
                } else {
                    missed += 1;
                }
            }
        }
        eprintln!("decided images: {matched} matched, {missed} missed");
        assert!(matched > 100, "{matched} images matched");
        assert!(missed > 100, "{missed} images missed");
    }
}
