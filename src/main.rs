//! The `berth` binary; everything lives in the library so tests can reach it.

fn main() -> std::process::ExitCode {
    berth::cli::run()
}
