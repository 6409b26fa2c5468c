//! A Rust program builds and runs a domain job from its typed settings
//! alone (no command line), and the keywords a front end passes give the
//! same job.
use std::ops::ControlFlow;

use ferrofeed_jobs::keywords::{from_keywords, DomainSettings};
use ferrofeed_jobs::vision::{self, TransformArg, VisionOptions};
use ferrofeed_jobs::{text, CommonSettings, JobError, TextSettings, VisionSettings};

fn tiny_vision(dir: &std::path::Path) -> VisionSettings {
    ferrofeed_vision::synth::write_dataset(dir, 24, 0, 2).unwrap();
    VisionSettings {
        path: Some(dir.to_path_buf()),
        vision: VisionOptions {
            transform: Some(TransformArg::Eval),
            size: 32,
            resize: ferrofeed_vision::ResizeTo::Shorter(40),
            ..VisionOptions::default()
        },
        common: CommonSettings {
            batch_size: 8,
            seed: 3,
            quiet: true,
            ..CommonSettings::default()
        },
    }
}

fn indices(job: &ferrofeed_jobs::Job, epoch: u64) -> Vec<Vec<u64>> {
    let mut out = Vec::new();
    job.run_epoch(epoch, None, false, |b, _| {
        let b = b?;
        assert_eq!(b.get("images").unwrap().shape(), &[b.len(), 3, 32, 32]);
        out.push(b.indices().to_vec());
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

#[test]
fn a_vision_job_builds_and_runs_from_its_settings() {
    let d = tempfile::tempdir().unwrap();
    let job = vision::build(tiny_vision(d.path())).unwrap();
    let got = indices(&job, 0);
    assert_eq!(got.len(), 3);
    let mut all: Vec<u64> = got.concat();
    all.sort_unstable();
    assert_eq!(all, (0..24).collect::<Vec<_>>());
}

#[test]
fn keywords_build_the_same_job_as_the_struct() {
    let d = tempfile::tempdir().unwrap();
    let by_struct = tiny_vision(d.path());
    let kw = serde_json::json!({
        "transform": "eval", "size": 32, "resize": 40, "batch_size": 8, "seed": 3, "quiet": true,
    });
    let by_keywords =
        from_keywords("vision", Some(d.path().into()), kw.as_object().unwrap()).unwrap();
    assert_eq!(by_keywords, DomainSettings::Vision(by_struct.clone()));
    let a = indices(&vision::build(by_struct).unwrap(), 1);
    let b = indices(&by_keywords.build().unwrap(), 1);
    assert_eq!(a, b);
}

#[test]
fn bad_settings_are_typed_errors_naming_the_setting() {
    let d = tempfile::tempdir().unwrap();
    let mut s = tiny_vision(d.path());
    s.common.epochs = 0;
    let Err(JobError::Usage(m)) = vision::build(s) else {
        panic!("built with 0 epochs")
    };
    assert!(m.contains("--epochs"), "{m}");
    let t = TextSettings {
        text: text::TextOptions {
            max_tokens: Some(0),
            ..Default::default()
        },
        ..Default::default()
    };
    let Err(JobError::Usage(m)) = text::build(t) else {
        panic!("built with max_tokens 0")
    };
    assert!(m.contains("--max-tokens"), "{m}");
}
