//! berth's log lines, captured in memory for a test to read back.

use std::sync::{Arc, Mutex, OnceLock};

/// Log lines written into memory.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

static LINES: OnceLock<Lines> = OnceLock::new();

/// Starts capturing, once per test binary, in berth's own format, berth's own lines at debug
/// ([`berth::telemetry::log_format`]). The subscriber is global: one set per
/// thread misses spans whose callsites another test's thread registered first.
/// Each test finds its own lines by a uid or span field of its own.
pub fn capture() {
    LINES.get_or_init(|| {
        let lines = Lines::default();
        let writer = lines.clone();
        let format = berth::telemetry::log_format(
            tracing_subscriber::EnvFilter::new("info,berth=debug"),
            false,
            move || writer.clone(),
        );
        tracing::subscriber::set_global_default(format).expect("one global subscriber");
        lines
    });
}

/// Everything logged since [`capture`] began.
pub fn logged() -> String {
    let lines = LINES.get().expect("capture() first");
    String::from_utf8_lossy(&lines.0.lock().unwrap()).into_owned()
}
