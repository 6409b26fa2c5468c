//! Stopping the command with SIGTERM or SIGINT (what SLURM, Kubernetes and
//! Ctrl-C send): the run ends at the next batch, writes `--save-state` and
//! the report, says so in one line, exits 143 or 130, and `--resume`
//! continues exactly; a second signal exits at once.
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn cache() -> PathBuf {
    std::env::temp_dir().join("ferrofeed-test-cache")
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ferrofeed"))
        .env("FERROFEED_CACHE_DIR", cache())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs")
}

fn signal(child: &Child, sig: i32) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Waits for `path` to exist (the run got that far).
fn wait_for(path: &Path, limit: Duration) {
    let t = Instant::now();
    while !path.exists() {
        assert!(t.elapsed() < limit, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for the child to exit within `limit`; its exit code and stderr.
fn wait_exit(mut child: Child, limit: Duration) -> (i32, String) {
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            let code = status.code().or(status.signal().map(|s| 128 + s)).unwrap();
            return (code, err);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("the command did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn files(dir: &Path, col: &str) -> Vec<Vec<u8>> {
    let mut f: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{col}_"))
        })
        .collect();
    f.sort();
    f.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn dataset(dir: &Path) {
    common::ok_in(
        &cache(),
        &[
            "make-dataset",
            "vision",
            dir.to_str().unwrap(),
            "--count",
            "40",
            "--seed",
            "4",
        ],
    );
}

/// The run's arguments: many epochs, so a signal always lands mid-run.
fn args<'a>(data: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "vision",
        data.to_str().unwrap(),
        "--batch-size",
        "4",
        "--size",
        "32",
        "--epochs",
        "500",
        "--seed",
        "8",
        "--quiet",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn sigterm_and_sigint_stop_at_a_batch_save_the_state_and_resume_exactly() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    dataset(&data);
    for (sig, code, name) in [
        (libc::SIGTERM, 143, "SIGTERM"),
        (libc::SIGINT, 130, "SIGINT"),
    ] {
        let (a, b, full) = (
            d.path().join(format!("a-{name}")),
            d.path().join(format!("b-{name}")),
            d.path().join(format!("full-{name}")),
        );
        let state = d.path().join(format!("state-{name}.json"));
        let report = d.path().join(format!("report-{name}.json"));
        let child = spawn(&args(
            &data,
            &[
                "--dump",
                a.to_str().unwrap(),
                "--save-state",
                state.to_str().unwrap(),
                "--report-json",
                report.to_str().unwrap(),
            ],
        ));
        // Past the first epoch (10 batches), so the state names a later one.
        wait_for(&a.join("indices_000013.npy"), Duration::from_secs(120));
        let sent = Instant::now();
        signal(&child, sig);
        let (status, stderr) = wait_exit(child, Duration::from_secs(30));
        eprintln!(
            "{name}: exited {:.0} ms after the signal",
            sent.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(status, code, "{name}: {stderr}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("interrupted"))
            .collect();
        assert_eq!(lines.len(), 1, "one line says so: {stderr}");
        assert!(
            lines[0].contains(name) && lines[0].contains("state saved"),
            "{}",
            lines[0]
        );
        let r: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
        let delivered = files(&a, "indices").len() as u64;
        assert_eq!(
            r["batches"], delivered,
            "the report counts what was delivered"
        );
        let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        assert_eq!(
            s["epoch"].as_u64().unwrap() * 10 + s["position"][0].as_u64().unwrap(),
            delivered,
            "the state is right after the last delivered batch"
        );
        // The rest, resumed, continues exactly where the stopped run ended.
        common::ok_in(
            &cache(),
            &args(
                &data,
                &[
                    "--dump",
                    b.to_str().unwrap(),
                    "--resume",
                    state.to_str().unwrap(),
                    "--limit-batches",
                    "7",
                ],
            ),
        );
        let total = (delivered + 7).to_string();
        common::ok_in(
            &cache(),
            &args(
                &data,
                &["--dump", full.to_str().unwrap(), "--limit-batches", &total],
            ),
        );
        for col in ["images", "labels", "indices"] {
            let joined: Vec<Vec<u8>> = files(&a, col).into_iter().chain(files(&b, col)).collect();
            assert_eq!(joined, files(&full, col), "{name}: {col}");
        }
    }
}

#[test]
fn a_second_signal_exits_at_once() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    dataset(&data);
    let out = d.path().join("dump");
    std::fs::create_dir_all(&out).unwrap();
    // The first batch's dump is a FIFO nobody reads: writing it blocks, so
    // the run can never reach its next batch and stop gracefully.
    let fifo = std::ffi::CString::new(out.join("images_000000.npy").to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let state = d.path().join("state.json");
    let mut child = spawn(&args(
        &data,
        &[
            "--dump",
            out.to_str().unwrap(),
            "--save-state",
            state.to_str().unwrap(),
        ],
    ));
    wait_for(&out.join("index.json"), Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    signal(&child, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first signal waits for the next batch"
    );
    let sent = Instant::now();
    signal(&child, libc::SIGINT);
    let (status, _) = wait_exit(child, Duration::from_secs(10));
    eprintln!(
        "second SIGINT: exited {:.0} ms after it",
        sent.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(status, 130);
    assert!(!state.exists(), "no graceful stop happened");
}
