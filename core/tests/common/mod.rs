//! Helpers shared by the engine's integration tests.

/// Threads of this process started by ferrofeed (named `ff-…`).
pub fn ff_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("ff-"))
                })
                .count()
        })
        .unwrap_or(0)
}
