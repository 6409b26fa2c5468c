//! What this process may really use: CPUs (affinity mask, cgroup v2
//! `cpu.max`, cgroup v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`) and memory
//! (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`, else physical RAM),
//! shared out among the ranks on this node (`LOCAL_WORLD_SIZE`, or SLURM's
//! tasks per node) — the workers per GPU, not per machine.
//!
//! Unreadable or odd files fall back to the next source, with a warning.
//!
//! ```
//! use ferrofeed_core::Resources;
//! let r = Resources::detect();
//! assert!(r.cpus > 0.0 && r.memory_bytes > 0);
//! assert!(r.workers() >= 1);
//! ```
use std::path::{Path, PathBuf};

/// CPUs and memory available to this rank, and where the figures came from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Resources {
    /// CPUs this rank may use (a cgroup quota can make it fractional).
    pub cpus: f64,
    /// Where `cpus` came from.
    pub cpu_source: String,
    /// Memory this rank may use, bytes.
    pub memory_bytes: u64,
    /// Where `memory_bytes` came from.
    pub memory_source: String,
    /// Ranks sharing this node.
    pub local_world_size: usize,
    /// Files that could not be read or parsed (each fell back).
    pub warnings: Vec<String>,
}

impl Resources {
    /// Reads the real `/proc` and `/sys` and the environment.
    pub fn detect() -> Resources {
        let affinity = std::thread::available_parallelism().map_or(1, |n| n.get());
        Resources::detect_in(Path::new("/"), affinity, |k| std::env::var(k).ok())
    }

    /// Reads `root/proc/…` and `root/sys/fs/cgroup/…` (a fake tree in tests),
    /// with `affinity` CPUs in the affinity mask and `env` for variables.
    pub fn detect_in(
        root: &Path,
        affinity: usize,
        env: impl Fn(&str) -> Option<String>,
    ) -> Resources {
        let mut warnings = Vec::new();
        let cgroups = read(root, "proc/self/cgroup", &mut warnings).unwrap_or_default();
        let mut cpus = affinity.max(1) as f64;
        let mut cpu_source = "affinity mask".to_string();
        if let Some((quota, source)) = cpu_quota(root, &cgroups, &mut warnings) {
            if quota < cpus {
                cpus = quota;
                cpu_source = source;
            }
        }
        let physical = read(root, "proc/meminfo", &mut warnings)
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024);
        let (mut memory_bytes, mut memory_source) = match physical {
            Some(b) => (b, "physical RAM".to_string()),
            None => (8 << 30, "unknown (assumed 8 GiB)".to_string()),
        };
        if let Some((limit, source)) = memory_limit(root, &cgroups, &mut warnings) {
            if limit < memory_bytes {
                memory_bytes = limit;
                memory_source = source;
            }
        }
        let local_world_size = local_world(&env, &mut warnings);
        if local_world_size > 1 {
            cpus /= local_world_size as f64;
            memory_bytes /= local_world_size as u64;
            cpu_source = format!("{cpu_source}, shared by {local_world_size} local ranks");
            memory_source = format!("{memory_source}, shared by {local_world_size} local ranks");
        }
        Resources {
            cpus,
            cpu_source,
            memory_bytes,
            memory_source,
            local_world_size,
            warnings,
        }
    }

    /// Workers for a CPU stage: the whole CPUs, at least one (a quota of
    /// 0.5 CPU is one worker, not `nproc`).
    pub fn workers(&self) -> usize {
        (self.cpus.floor() as usize).max(1)
    }

    /// A default byte budget: a tenth of the memory, between 64 MiB and 1 GiB.
    pub fn default_budget(&self) -> usize {
        ((self.memory_bytes / 10) as usize).clamp(64 << 20, 1 << 30)
    }
}

fn read(root: &Path, rel: &str, warnings: &mut Vec<String>) -> Option<String> {
    let p = root.join(rel);
    match std::fs::read_to_string(&p) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            warnings.push(format!("{}: {e}", p.display()));
            None
        }
    }
}

/// `(hierarchy, path)` pairs from `/proc/self/cgroup`.
fn cgroup_paths(cgroups: &str) -> Vec<(String, String)> {
    cgroups
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?.to_string();
            let path = parts.next()?.to_string();
            Some((controllers, path))
        })
        .collect()
}

/// The cgroup folder and its ancestors, innermost first.
fn ancestors(base: PathBuf, path: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut p = PathBuf::from(path.trim_start_matches('/'));
    loop {
        out.push(base.join(&p));
        if !p.pop() {
            break;
        }
    }
    out
}

fn cpu_quota(root: &Path, cgroups: &str, warnings: &mut Vec<String>) -> Option<(f64, String)> {
    let mut best: Option<(f64, String)> = None;
    let mut consider = |q: f64, src: String| {
        if q > 0.0 && best.as_ref().is_none_or(|(b, _)| q < *b) {
            best = Some((q, src));
        }
    };
    for (controllers, path) in cgroup_paths(cgroups) {
        if controllers.is_empty() {
            // cgroup v2
            for dir in ancestors(root.join("sys/fs/cgroup"), &path) {
                let f = dir.join("cpu.max");
                let Ok(text) = std::fs::read_to_string(&f) else {
                    continue;
                };
                let mut it = text.split_whitespace();
                match (it.next(), it.next().map(str::parse::<f64>)) {
                    (Some("max"), _) => {}
                    (Some(q), Some(Ok(period))) if period > 0.0 => match q.parse::<f64>() {
                        Ok(q) => {
                            consider(q / period, format!("cgroup v2 cpu.max ({})", f.display()))
                        }
                        Err(_) => warnings.push(format!("{}: cannot parse {text:?}", f.display())),
                    },
                    _ => warnings.push(format!("{}: cannot parse {text:?}", f.display())),
                }
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            // cgroup v1
            let base = root.join("sys/fs/cgroup").join(&controllers);
            for dir in ancestors(base, &path) {
                let (Ok(q), Ok(p)) = (
                    std::fs::read_to_string(dir.join("cpu.cfs_quota_us")),
                    std::fs::read_to_string(dir.join("cpu.cfs_period_us")),
                ) else {
                    continue;
                };
                match (q.trim().parse::<f64>(), p.trim().parse::<f64>()) {
                    (Ok(q), Ok(p)) if q > 0.0 && p > 0.0 => {
                        consider(q / p, format!("cgroup v1 cfs quota ({})", dir.display()))
                    }
                    (Ok(_), Ok(_)) => {}
                    _ => warnings.push(format!(
                        "{}: cannot parse the cfs quota/period",
                        dir.display()
                    )),
                }
            }
        }
    }
    best
}

fn memory_limit(root: &Path, cgroups: &str, warnings: &mut Vec<String>) -> Option<(u64, String)> {
    let mut best: Option<(u64, String)> = None;
    for (controllers, path) in cgroup_paths(cgroups) {
        let (base, file) = if controllers.is_empty() {
            (root.join("sys/fs/cgroup"), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                root.join("sys/fs/cgroup").join(&controllers),
                "memory.limit_in_bytes",
            )
        } else {
            continue;
        };
        for dir in ancestors(base, &path) {
            let f = dir.join(file);
            let Ok(text) = std::fs::read_to_string(&f) else {
                continue;
            };
            let t = text.trim();
            if t == "max" {
                continue;
            }
            match t.parse::<u64>() {
                // v1 reports "no limit" as a huge page-rounded number.
                Ok(b) if b >= (1u64 << 60) => {}
                Ok(b) if best.as_ref().is_none_or(|(x, _)| b < *x) => {
                    best = Some((b, format!("cgroup {file} ({})", f.display())));
                }
                Ok(_) => {}
                Err(_) => warnings.push(format!("{}: cannot parse {t:?}", f.display())),
            }
        }
    }
    best
}

fn local_world(env: &impl Fn(&str) -> Option<String>, warnings: &mut Vec<String>) -> usize {
    if let Some(v) = env("LOCAL_WORLD_SIZE") {
        match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => return n,
            _ => warnings.push(format!(
                "LOCAL_WORLD_SIZE={v:?} is not a positive whole number"
            )),
        }
    }
    if let Some(v) = env("SLURM_NTASKS_PER_NODE").or_else(|| env("SLURM_TASKS_PER_NODE")) {
        // "4" or "4(x2)" or "4(x2),3": this node's count is the first.
        let first = v.split([',', '(']).next().unwrap_or("");
        match first.trim().parse::<usize>() {
            Ok(n) if n > 0 => return n,
            _ => warnings.push(format!("SLURM tasks per node {v:?} cannot be parsed")),
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile_lite::Dir {
        let d = tempfile_lite::Dir::new();
        for (rel, text) in files {
            let p = d.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    /// A throwaway folder (core has no tempfile dependency).
    mod tempfile_lite {
        pub(super) struct Dir(std::path::PathBuf);
        impl Dir {
            pub(super) fn new() -> Dir {
                use std::sync::atomic::{AtomicU64, Ordering};
                static N: AtomicU64 = AtomicU64::new(0);
                let p = std::env::temp_dir().join(format!(
                    "ff-res-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub(super) fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    const MEMINFO: &str = "MemTotal:       16384000 kB\nMemFree: 1 kB\n";

    #[test]
    fn a_half_cpu_v2_quota_is_one_worker() {
        let d = tree(&[
            ("proc/self/cgroup", "0::/pod/ctr\n"),
            ("proc/meminfo", MEMINFO),
            ("sys/fs/cgroup/pod/ctr/cpu.max", "50000 100000\n"),
            ("sys/fs/cgroup/pod/ctr/memory.max", "1073741824\n"),
        ]);
        let r = Resources::detect_in(d.path(), 16, |_| None);
        assert_eq!(r.cpus, 0.5);
        assert_eq!(r.workers(), 1);
        assert!(r.cpu_source.contains("cpu.max"));
        assert_eq!(r.memory_bytes, 1 << 30);
        assert_eq!(r.default_budget(), 107_374_182);
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn parent_limits_and_v1_files_count_too() {
        let d = tree(&[
            (
                "proc/self/cgroup",
                "4:memory:/job\n3:cpu,cpuacct:/job/step\n",
            ),
            ("proc/meminfo", MEMINFO),
            (
                "sys/fs/cgroup/cpu,cpuacct/job/step/cpu.cfs_quota_us",
                "-1\n",
            ),
            (
                "sys/fs/cgroup/cpu,cpuacct/job/step/cpu.cfs_period_us",
                "100000\n",
            ),
            ("sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us", "300000\n"),
            (
                "sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us",
                "100000\n",
            ),
            (
                "sys/fs/cgroup/memory/job/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        let r = Resources::detect_in(d.path(), 8, |_| None);
        assert_eq!(r.cpus, 3.0);
        assert_eq!(
            r.memory_bytes,
            16_384_000 * 1024,
            "the v1 'no limit' value is ignored"
        );
        assert_eq!(r.memory_source, "physical RAM");
    }

    #[test]
    fn local_ranks_share_the_node() {
        let d = tree(&[("proc/self/cgroup", "0::/\n"), ("proc/meminfo", MEMINFO)]);
        let r = Resources::detect_in(d.path(), 16, |k| {
            (k == "LOCAL_WORLD_SIZE").then(|| "4".to_string())
        });
        assert_eq!((r.cpus, r.workers(), r.local_world_size), (4.0, 4, 4));
        let s = Resources::detect_in(d.path(), 16, |k| {
            (k == "SLURM_TASKS_PER_NODE").then(|| "8(x2)".to_string())
        });
        assert_eq!(s.workers(), 2);
    }

    #[test]
    fn odd_files_fall_back_with_a_warning() {
        let d = tree(&[
            ("proc/self/cgroup", "0::/c\n"),
            ("sys/fs/cgroup/c/cpu.max", "lots 100000\n"),
            ("sys/fs/cgroup/c/memory.max", "plenty\n"),
        ]);
        let r = Resources::detect_in(d.path(), 2, |k| {
            (k == "LOCAL_WORLD_SIZE").then(|| "zero".to_string())
        });
        assert_eq!(r.cpus, 2.0);
        assert_eq!(r.memory_source, "unknown (assumed 8 GiB)");
        assert_eq!(r.warnings.len(), 3, "{:?}", r.warnings);
    }
}
