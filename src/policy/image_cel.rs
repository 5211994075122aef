//! STUB (replaced by the i44-globs branch): image globs and references for CEL.

use super::image::ImagePatterns;

/// One RE2 regex matching what any of `patterns` matches.
pub fn glob_regex(patterns: &ImagePatterns) -> Result<String, String> {
    let _ = patterns;
    Err("not yet".into())
}

/// CEL yielding the normalised reference of the CEL string `image`, or `''`.
pub fn normalised_image_cel(image: &str) -> String {
    format!("{image}")
}
