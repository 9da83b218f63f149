fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(lockrun::run())
}
