//! Kubernetes resource quantities (`500m`, `2Gi`, `1e3`) as numbers, for the two
//! things berth does with them: compare a container's requests with its limits
//! (QoS class) and add requests up against a node's allocatable (gang fit check).

use serde_json::Value;

/// A quantity in base units (cores, bytes, pods), or `None` when it is not one.
pub fn parse(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (mantissa, exponent) = match suffix.strip_prefix(['e', 'E']) {
        Some(exp) if !exp.is_empty() => (number, exp.parse::<i32>().ok()?),
        _ => {
            let scale = scale(suffix)?;
            return finite(number.parse::<f64>().ok()? * scale);
        }
    };
    finite(mantissa.parse::<f64>().ok()? * 10f64.powi(exponent))
}

/// A quantity as JSON carries it: a string, or (from some clients) a number.
pub fn from_json(value: &Value) -> Option<f64> {
    match value {
        Value::String(s) => parse(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

fn finite(n: f64) -> Option<f64> {
    (n.is_finite() && n >= 0.0).then_some(n)
}

fn scale(suffix: &str) -> Option<f64> {
    let binary = |power: i32| Some(1024f64.powi(power));
    let decimal = |power: i32| Some(1000f64.powi(power));
    match suffix {
        "" => Some(1.0),
        "n" => Some(1e-9),
        "u" => Some(1e-6),
        "m" => Some(1e-3),
        "k" => decimal(1),
        "M" => decimal(2),
        "G" => decimal(3),
        "T" => decimal(4),
        "P" => decimal(5),
        "E" => decimal(6),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_and_exponents_scale() {
        assert_eq!(parse("500m"), Some(0.5));
        assert_eq!(parse("2"), Some(2.0));
        assert_eq!(parse("1Ki"), Some(1024.0));
        assert_eq!(parse("2Gi"), Some(2.0 * 1024f64.powi(3)));
        assert_eq!(parse("1M"), Some(1e6));
        assert_eq!(parse("1e3"), Some(1000.0));
        assert_eq!(parse("1.5"), Some(1.5));
        assert_eq!(parse("1000m"), parse("1"));
        for bad in ["", "abc", "1Xi", "-1", "1e", "1..2"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        assert_eq!(from_json(&serde_json::json!(3)), Some(3.0));
    }
}
