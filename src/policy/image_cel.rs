//! berth's image matching ([`ImageRef`], [`ImagePatterns`]) as CEL text, for a
//! MutatingAdmissionPolicy that applies static placement inside the apiserver.
//!
//! Two pieces: [`normalised_image_cel`], a CEL expression that normalises an image
//! as [`ImageRef::new`] does (or says it cannot tell), and [`glob_regex`], one RE2
//! regex for CEL's `matches` that matches what the globs match. Both are exact
//! where they answer; where CEL could differ from berth they refuse, and berth's
//! webhook decides.
//!
//! [`ImageRef::new`]: super::ImageRef::new
//! [`ImageRef`]: super::ImageRef

use super::ImagePatterns;
use super::image::glob;

/// What [`normalised_image_cel`] yields when CEL cannot tell the normalised form.
/// No image outside the empty string normalises to it (a string that is not a
/// reference is kept as written, and the empty string is no reference), and a pod
/// whose image is empty fails the apiserver's validation anyway.
pub const CANNOT_TELL: &str = "";

/// The longest image [`normalised_image_cel`] decides. oci-spec refuses a
/// repository longer than 255 characters, and the repository is at most the
/// image's name part with `library/` (8 characters) in front; bounding the whole
/// string keeps that rule out of the CEL. Real images are far shorter.
pub const LONGEST_DECIDED: usize = 255 - "library/".len();

/// A domain component of the distribution grammar, lowercase only: oci-spec
/// allows capitals in any first component (so `Foo/bar` is the repository
/// `docker.io/Foo/bar` to it, and an error to Docker), which would take more CEL
/// than it is worth; no real registry is written so.
const DOMAIN_COMPONENT: &str = "[a-z0-9](?:[a-z0-9-]*[a-z0-9])?";
/// A path component of the distribution grammar (lowercase there too).
const PATH_COMPONENT: &str = "[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
/// A tag; oci-spec's `\w` is Unicode, this is its ASCII part.
const TAG: &str = "[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}";
/// The digests oci-spec accepts: only these algorithms, only these lengths.
const DIGEST: &str = "sha256:[0-9a-fA-F]{64}|sha384:[0-9a-fA-F]{96}|sha512:[0-9a-fA-F]{128}";

/// The images [`normalised_image_cel`] decides: an ASCII subset of the references
/// oci-spec parses, in which the name, tag and digest are told apart by the
/// first `@` and the last `:` after the last `/` alone (a port is always followed
/// by `/`, a tag and a digest never contain one). The same text is a valid Rust
/// regex with the same meaning, which the tests use.
pub fn decided_images_regex() -> String {
    let domain = format!("{DOMAIN_COMPONENT}(?:\\.{DOMAIN_COMPONENT})*(?::[0-9]+)?");
    format!("^(?:{domain}/)?{PATH_COMPONENT}(?:/{PATH_COMPONENT})*(?::{TAG})?(?:@(?:{DIGEST}))?$")
}

/// A CEL expression for the image that the CEL expression `image` (a string, say
/// `c.image`) names, normalised exactly as [`ImageRef::new`] normalises it, or
/// [`CANNOT_TELL`] for an image outside [`decided_images_regex`] or longer than
/// [`LONGEST_DECIDED`].
///
/// The rules are oci-spec's `split_domain`: the first `/`-separated component is
/// a registry if it has a `.` or `:` or is `localhost`, else the registry is
/// `docker.io`; `index.docker.io` is `docker.io`; a docker.io repository without
/// `/` gets `library/`; no tag and no digest means `:latest`. Only functions of
/// the Kubernetes CEL environment (`matches`, `contains`, `size` and the strings
/// extension's `indexOf` and `substring`), a fixed number of calls, no `cel.bind`
/// (absent there): `image` is repeated, so it should be a cheap expression.
///
/// [`ImageRef::new`]: super::ImageRef::new
pub fn normalised_image_cel(image: &str) -> String {
    let i = format!("({image})");
    let decided = cel_string(&decided_images_regex());
    let registry = cel_string(r"^(?:[^/]*[.:][^/]*|localhost)/");
    let docker_hub = cel_string(r"^(?:index\.)?docker\.io/");
    // The repository, tag and digest on Docker Hub: the image without its
    // registry when that is docker.io, the whole image when it names none.
    let hub = format!("({i}.matches({docker_hub}) ? {i}.substring({i}.indexOf('/') + 1) : {i})");
    let named = format!(
        "({i}.matches({registry}) && !{i}.matches({docker_hub}) ? {i} \
         : 'docker.io/' + ({hub}.contains('/') ? '' : 'library/') + {hub})"
    );
    let latest = format!("({i}.contains('@') || {i}.matches(':[^/]*$') ? '' : ':latest')");
    format!(
        "(size({i}) <= {LONGEST_DECIDED} && {i}.matches({decided}) ? {named} + {latest} : {})",
        cel_string(CANNOT_TELL)
    )
}

/// One RE2 regex (for CEL's `matches`, which is RE2) that matches a string
/// exactly when the string is ASCII and one of `patterns` matches it as
/// [`ImagePatterns::first_match`] does; on [`normalised_image_cel`]'s answers
/// (ASCII or [`CANNOT_TELL`]) that is the same as berth.
///
/// Built from globset's own regex for each glob, so the glob syntax is read in one
/// place. That regex is Rust's, over bytes (`(?-u)`, `.` matching any byte and
/// a newline); RE2 in CEL matches characters, so each `.` becomes "any ASCII
/// character" and each negated class also excludes non-ASCII. A glob with a
/// character outside printable ASCII is refused, as is anything in globset's
/// regex this translation does not know; the reason names the glob.
///
/// One exception, globset's: it finds no file name in a string whose last `/`
/// component is `..`, and a glob it matches by name or extension (`*.`, `?.`)
/// then misses such a string where the regex matches it. No reference, and so no
/// normalised one, ends so.
///
/// An empty list is refused too: it means "every image", which needs no regex
/// (and [`ImagePatterns::first_match`] matches nothing on it).
pub fn glob_regex(patterns: &ImagePatterns) -> Result<String, String> {
    if patterns.is_empty() {
        return Err("no image globs: an empty list means every image".into());
    }
    let mut alternatives = Vec::new();
    for pattern in patterns.patterns() {
        let refuse = |why: String| format!("image glob {pattern:?}: {why}");
        if !pattern.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return Err(refuse(
                "only printable ASCII globs can be matched in an admission policy".into(),
            ));
        }
        let compiled = glob(pattern).map_err(|e| refuse(e.kind().to_string()))?;
        let regex = compiled.regex();
        let body = regex
            .strip_prefix("(?-u)^")
            .and_then(|body| body.strip_suffix('$'))
            .ok_or_else(|| refuse(format!("unexpected regex {regex:?}")))?;
        let translated = re2(body).map_err(|why| refuse(format!("{why} in {regex:?}")))?;
        alternatives.push(format!("(?:{translated})"));
    }
    Ok(format!("^(?:{})$", alternatives.join("|")))
}

/// Any ASCII character, a newline too (globset's `.` matches any byte).
const ASCII: &str = r"[\x00-\x7F]";
/// Added to a negated class so that it too matches only ASCII.
const NOT_ASCII: &str = r"\x{80}-\x{10FFFF}";
/// What `regex_syntax::escape` escapes, which globset uses for literals; each of
/// them escaped is itself in RE2 too, in a class or out.
const ESCAPED: &str = r"\.+*?()|[]{}^$#&-~";

/// globset's regex `body` (between `(?-u)^` and `$`) in RE2 syntax, matching the
/// same ASCII strings and no other; an error for anything not known to mean the
/// same in both.
fn re2(body: &str) -> Result<String, String> {
    let mut out = String::with_capacity(body.len() * 2);
    let mut chars = body.chars().peekable();
    // Inside a class: whether it is negated.
    let mut class: Option<bool> = None;
    while let Some(c) = chars.next() {
        match (c, class) {
            ('\\', _) => match chars.next() {
                Some(e) if ESCAPED.contains(e) => {
                    out.push('\\');
                    out.push(e);
                }
                other => return Err(format!("an escape \\{}", other.unwrap_or(' '))),
            },
            ('[', None) => {
                let negated = chars.next_if_eq(&'^').is_some();
                out.push_str(if negated { "[^" } else { "[" });
                class = Some(negated);
            }
            ('[', Some(_)) => return Err("a nested class".into()),
            (']', Some(negated)) => {
                if negated {
                    out.push_str(NOT_ASCII);
                }
                out.push(']');
                class = None;
            }
            ('.', None) => out.push_str(ASCII),
            ('(', None) => {
                // Only non-capturing groups: `(?i)` and the like would change
                // the meaning, a capture group is never made.
                if chars.next_if_eq(&'?').is_some() {
                    if chars.next_if_eq(&':').is_none() {
                        return Err("a group with flags".into());
                    }
                    out.push_str("(?:");
                } else {
                    return Err("a capturing group".into());
                }
            }
            (' '..='~', _) => out.push(c),
            _ => return Err(format!("the character {c:?}")),
        }
    }
    match class {
        Some(_) => Err("an unclosed class".into()),
        None => Ok(out),
    }
}

/// `text` as a CEL string literal (single-quoted, escaped), to put regexes from
/// this module into CEL source.
pub fn cel_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('\'');
    for c in text.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '\'' => out.push_str(r"\'"),
            ' '..='~' => out.push(c),
            _ => out.push_str(&format!("\\U{:08x}", u32::from(c))),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use regex::Regex;

    use super::*;
    use crate::policy::ImageRef;

    #[test]
    fn realistic_images_are_decided() {
        let decided = Regex::new(&decided_images_regex()).unwrap();
        for image in [
            "nginx",
            "library/nginx:1.27",
            "ghcr.io/org/app:v1",
            "localhost/x",
            "registry.example.com:5000/cdn/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            assert!(decided.is_match(image), "{image}");
        }
    }

    #[test]
    fn odd_images_are_not_decided() {
        let decided = Regex::new(&decided_images_regex()).unwrap();
        for image in [
            "",
            "Nginx",
            "Registry.example.com/app",
            "nginx:",
            "nginx:-x",
            "nginx@sha256:abc",
            "nginx@md5:0123456789abcdef0123456789abcdef",
            "nginx:t\u{e9}",
            "nginx\n",
            "/nginx",
            "nginx/",
            "a//b",
        ] {
            assert!(!decided.is_match(image), "{image:?}");
        }
    }

    #[test]
    fn the_regex_is_anchored_and_joins_the_globs() {
        let set = ImagePatterns::new(&["registry.example.com/cdn/*", "*redis*"]).unwrap();
        let re = glob_regex(&set).unwrap();
        assert_eq!(
            re,
            r"^(?:(?:registry\.example\.com/cdn/[\x00-\x7F]*)|(?:[\x00-\x7F]*redis[\x00-\x7F]*))$"
        );
        let re = Regex::new(&re).unwrap();
        assert!(re.is_match("registry.example.com/cdn/app:1"));
        assert!(!re.is_match("registry.example.com.evil.io/cdn/app"));
        assert!(!re.is_match("evil.io/registry.example.com/cdn/app"));
        assert!(re.is_match("docker.io/bitnami/redis:7"));
    }

    #[test]
    fn globs_the_policy_cannot_match_as_berth_are_refused() {
        for pattern in ["caf\u{e9}/*", "tab\there", "\u{2603}"] {
            let set = ImagePatterns::new(&[pattern]).unwrap();
            let err = glob_regex(&set).unwrap_err();
            assert!(err.contains(&format!("{pattern:?}")), "{err}");
        }
        let empty: [&str; 0] = [];
        assert!(glob_regex(&ImagePatterns::new(&empty).unwrap()).is_err());
    }

    #[test]
    fn the_translation_refuses_what_it_does_not_know() {
        assert_eq!(re2(r"a\.b[^/]c").unwrap(), r"a\.b[^/\x{80}-\x{10FFFF}]c");
        for body in [r"(?i)a", r"(a)", r"\xe2", r"\d", "[a[b]", "[ab", "\u{e9}"] {
            assert!(re2(body).is_err(), "{body}");
        }
    }

    #[test]
    fn globset_misses_a_name_of_two_dots_where_the_regex_matches() {
        let set = ImagePatterns::new(&["*."]).unwrap();
        let re = Regex::new(&glob_regex(&set).unwrap()).unwrap();
        for subject in ["..", "a/.."] {
            let image = ImageRef {
                written: subject.into(),
                normalised: subject.into(),
            };
            assert!(set.first_match(&image).is_none(), "{subject}");
            assert!(re.is_match(subject), "{subject}");
        }
        assert!(re.is_match("a."));
    }

    #[test]
    fn cel_strings_are_escaped() {
        assert_eq!(cel_string(r"a\.b'c"), r"'a\\.b\'c'");
        assert_eq!(cel_string("\n"), r"'\U0000000a'");
    }
}
