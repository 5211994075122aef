//! Container image references, normalised, and the globs that match them.
//!
//! Globs match the *normalised* reference, so `nginx`, `docker.io/library/nginx`
//! and `index.docker.io/library/nginx:latest` are the same image to a policy and
//! there is one spelling to write patterns for: `docker.io/library/nginx:latest`.
//! Matching is anchored at both ends, so `registry.example.com/cdn/*` can never
//! match `registry.example.com.evil.io/cdn/app`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use globset::{Candidate, Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use oci_spec::distribution::Reference;

/// A container image as a pod names it, and its normalised form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// What the pod spec says.
    pub written: String,
    /// `registry/repository:tag`, `registry/repository@digest` or both; the
    /// implicit `docker.io`, `library/` and `:latest` made explicit. A string that is
    /// not a valid reference is kept as written.
    pub normalised: String,
}

impl ImageRef {
    pub fn new(written: &str) -> ImageRef {
        ImageRef {
            written: written.to_owned(),
            normalised: remembered(written),
        }
    }
}

/// How many normalised references [`remembered`] keeps, and the longest it keeps.
const REMEMBERED: usize = 1024;
const REMEMBERED_LENGTH: usize = 256;

/// `written` normalised. Parsing a reference runs oci-spec's regex, about 5 µs an
/// image, and every pod admitted names its images again; a cluster runs few
/// distinct images, each in many pods, so the answers are remembered. The memory
/// is bounded (it is forgotten whole when full, so tenants churning names only
/// make it useless, never large).
fn remembered(written: &str) -> String {
    static SEEN: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Mutex::default);
    let lock = || seen.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(normalised) = lock().get(written) {
        return normalised.clone();
    }
    let normalised = normalised(written);
    if written.len() <= REMEMBERED_LENGTH {
        let mut seen = lock();
        if seen.len() >= REMEMBERED {
            seen.clear();
        }
        seen.insert(written.to_owned(), normalised.clone());
    }
    normalised
}

/// `written` as a normalised reference; a string that is not a valid reference is
/// kept as written.
fn normalised(written: &str) -> String {
    match written.parse::<Reference>() {
        Ok(reference) => normalise(&reference),
        Err(_) => written.to_owned(),
    }
}

fn normalise(reference: &Reference) -> String {
    let base = format!("{}/{}", reference.registry(), reference.repository());
    match (reference.tag(), reference.digest()) {
        (Some(tag), Some(digest)) => format!("{base}:{tag}@{digest}"),
        (None, Some(digest)) => format!("{base}@{digest}"),
        (Some(tag), None) => format!("{base}:{tag}"),
        (None, None) => format!("{base}:latest"),
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.normalised)
    }
}

/// A compiled list of image globs; empty means "every image".
#[derive(Debug, Clone)]
pub struct ImagePatterns {
    patterns: Vec<String>,
    set: GlobSet,
}

/// A glob that does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad image glob {pattern:?}: {reason}")]
pub struct GlobError {
    pub pattern: String,
    pub reason: String,
}

/// `pattern` compiled as policies' image globs are, in one place so that
/// [`ImagePatterns`] and its RE2 translation (`image_cel`) cannot drift apart.
pub(crate) fn glob(pattern: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(pattern)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
}

impl ImagePatterns {
    /// Compiles `patterns`; `*` also matches `/`, so `*cdn*` finds `cdn` anywhere.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<ImagePatterns, GlobError> {
        let mut builder = GlobSetBuilder::new();
        for pattern in patterns {
            let pattern = pattern.as_ref();
            let error = |reason: String| GlobError {
                pattern: pattern.to_owned(),
                reason,
            };
            if pattern.trim().is_empty() {
                return Err(error("a pattern may not be empty".into()));
            }
            if pattern.trim() != pattern {
                return Err(error("a pattern may not start or end with spaces".into()));
            }
            let glob = glob(pattern).map_err(|e| error(e.kind().to_string()))?;
            builder.add(glob);
        }
        let set = builder.build().map_err(|e| GlobError {
            pattern: patterns
                .iter()
                .map(|p| p.as_ref())
                .collect::<Vec<_>>()
                .join(", "),
            reason: e.to_string(),
        })?;
        Ok(ImagePatterns {
            patterns: patterns.iter().map(|p| p.as_ref().to_owned()).collect(),
            set,
        })
    }

    /// True when there are no patterns, which means every image.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// The first pattern that matches `image`, if any. Whether one matches is
    /// asked first: that search stops at the first match, where listing them all
    /// runs every pattern to the end, and most images a policy sees match none.
    pub fn first_match(&self, image: &ImageRef) -> Option<&str> {
        let candidate = Candidate::new(&image.normalised);
        if !self.set.is_match_candidate(&candidate) {
            return None;
        }
        match self.patterns.as_slice() {
            [only] => Some(only),
            _ => self
                .set
                .matches_candidate(&candidate)
                .first()
                .map(|&i| self.patterns[i].as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_are_normalised() {
        let cases = [
            ("nginx", "docker.io/library/nginx:latest"),
            ("nginx:1.27", "docker.io/library/nginx:1.27"),
            ("docker.io/library/nginx", "docker.io/library/nginx:latest"),
            ("docker.io/nginx", "docker.io/library/nginx:latest"),
            (
                "index.docker.io/library/nginx:1.27",
                "docker.io/library/nginx:1.27",
            ),
            ("bitnami/redis:7", "docker.io/bitnami/redis:7"),
            ("localhost:5000/cdn/app", "localhost:5000/cdn/app:latest"),
            (
                "registry.example.com/cdn/app:v2",
                "registry.example.com/cdn/app:v2",
            ),
        ];
        for (written, normalised) in cases {
            assert_eq!(ImageRef::new(written).normalised, normalised, "{written}");
        }
        let with_digest = format!("registry.example.com:5000/cdn/app@{DIGEST}");
        assert_eq!(ImageRef::new(&with_digest).normalised, with_digest);
        let tag_and_digest = format!("nginx:1.27@{DIGEST}");
        assert_eq!(
            ImageRef::new(&tag_and_digest).normalised,
            format!("docker.io/library/nginx:1.27@{DIGEST}")
        );
    }

    #[test]
    fn a_string_that_is_not_a_reference_is_matched_as_written() {
        let image = ImageRef::new("Not A Reference");
        assert_eq!(image.normalised, "Not A Reference");
    }

    #[test]
    fn globs_match_the_normalised_reference() {
        let digest_ref = format!("registry.example.com:5000/cdn/app@{DIGEST}");
        let cases: &[(&str, &str, bool)] = &[
            ("*cdn*", "nginx", false),
            ("*cdn*", "example/cdn-uploader:1.0", true),
            ("docker.io/library/nginx:*", "nginx", true),
            ("docker.io/library/nginx:*", "docker.io/library/nginx", true),
            (
                "docker.io/library/nginx:1.27",
                "index.docker.io/library/nginx:1.27",
                true,
            ),
            ("docker.io/library/nginx*", "nginx:1.27", true),
            ("nginx", "nginx", false), // patterns see the normalised form only
            ("registry.example.com:5000/cdn/*", &digest_ref, true),
            ("localhost:5000/cdn/*", "localhost:5000/cdn/app", true),
            (
                "registry.example.com/cdn/*",
                "registry.example.com/cdn/app",
                true,
            ),
            (
                "registry.example.com/cdn/*",
                "registry.example.com.evil.io/cdn/app",
                false,
            ),
            (
                "registry.example.com/cdn/*",
                "evil.io/registry.example.com/cdn/app",
                false,
            ),
            ("*/cdn/*", "registry.example.com/cdn/app:v1", true),
        ];
        for (glob, image, expected) in cases {
            let patterns = ImagePatterns::new(&[*glob]).expect("valid glob");
            let image_ref = ImageRef::new(image);
            assert_eq!(
                patterns.first_match(&image_ref).is_some(),
                *expected,
                "{glob} vs {image} (normalised {image_ref})"
            );
        }
    }

    #[test]
    fn the_first_matching_pattern_is_reported() {
        let patterns = ImagePatterns::new(&["*redis*", "*cdn*"]).unwrap();
        assert_eq!(
            patterns.first_match(&ImageRef::new("cdn/app")),
            Some("*cdn*")
        );
        // Of several that match, the one listed first.
        for (patterns, first) in [(["*cdn*", "*app*"], "*cdn*"), (["*app*", "*cdn*"], "*app*")] {
            let patterns = ImagePatterns::new(&patterns).unwrap();
            let image = ImageRef::new("cdn/app");
            assert_eq!(patterns.first_match(&image), Some(first));
        }
        assert_eq!(patterns.first_match(&ImageRef::new("nginx")), None);
    }

    #[test]
    fn bad_globs_are_rejected_with_the_pattern_named() {
        let err = ImagePatterns::new(&["registry/[cdn"]).unwrap_err();
        assert_eq!(err.pattern, "registry/[cdn");
        assert!(err.to_string().contains("bad image glob"), "{err}");
        assert!(ImagePatterns::new(&[""]).is_err());
        assert!(ImagePatterns::new(&[" *cdn*"]).is_err());
    }
}
