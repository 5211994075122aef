//! AdmissionResponse warnings: kubectl prints them, and the apiserver drops or
//! truncates long ones, so every warning berth emits is kept under 120 characters.

/// The longest warning berth emits, in characters.
pub const MAX_WARNING: usize = 119;

/// `text`, shortened with an ellipsis to at most [`MAX_WARNING`] characters.
pub fn bounded(text: impl Into<String>) -> String {
    let text = text.into();
    if text.chars().count() <= MAX_WARNING {
        return text;
    }
    let mut short: String = text.chars().take(MAX_WARNING - 1).collect();
    short.push('…');
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_warnings_are_cut_below_120_characters() {
        let long = "x".repeat(300);
        let short = bounded(long);
        assert_eq!(short.chars().count(), MAX_WARNING);
        assert!(short.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }
}
