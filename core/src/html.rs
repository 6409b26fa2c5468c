//! The run report as one self-contained HTML page: inline SVG plots and
//! CSS, no script, no external reference, so it opens from a file with no
//! server and no network. Light and dark browser themes both read well
//! (`prefers-color-scheme`), and each stage keeps one colour in every plot.
//!
//! ```
//! use ferrofeed_core::prelude::*;
//! use ferrofeed_core::ReportPage;
//! let p = Pipeline::builder(FnSource::new(64, |i| Ok(i as i64)))
//!     .batch_size(8)
//!     .collate(StackCollate::new().column::<i64>("x"))
//!     .build()
//!     .unwrap();
//! let mut it = p.epoch(0);
//! while it.next().is_some() {}
//! let html = ReportPage::from_pipeline(&p, it.summary(), "example").render();
//! assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg"));
//! assert!(p.report_html(it.summary()).contains("ferrofeed pipeline"));
//! assert!(!html.contains("http://") && !html.contains("https://"));
//! ```
use std::fmt::Write;

use crate::metrics::{Bottleneck, EpochSummary, StageReport, Timeline, TimelinePoint};
use crate::pipeline::Pipeline;

/// Everything the page shows. [`ReportPage::from_pipeline`] fills it from a
/// pipeline and an epoch; front ends add what they know (resources, epochs,
/// sample images).
#[derive(Debug, Clone, Default)]
pub struct ReportPage {
    /// Heading, e.g. `ferrofeed vision`.
    pub title: String,
    /// What a sample is (`images`, `sequences`, `chunks`, `samples`).
    pub unit: String,
    /// Samples delivered.
    pub samples: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Wall time of the run.
    pub seconds: f64,
    /// Time the consumer waited for batches.
    pub data_stall_seconds: f64,
    /// Per-stage figures.
    pub stages: Vec<StageReport>,
    /// The limiting stage and its advice.
    pub bottleneck: Option<Bottleneck>,
    /// Queue fill, bytes, throughput and workers over time.
    pub timeline: Timeline,
    /// The byte budget.
    pub max_bytes_in_flight: u64,
    /// The most bytes held at once.
    pub peak_bytes_in_flight: u64,
    /// `(epoch, samples/s)` of each epoch.
    pub epochs: Vec<(u64, f64)>,
    /// Skipped samples: `(index, path, stage, error)`.
    pub skipped: Vec<(Option<u64>, Option<String>, String, String)>,
    /// `(what, value)` rows about the machine (CPUs and their source,
    /// memory limit, …).
    pub resources: Vec<(String, String)>,
    /// `(stage, PNG bytes)`: a sample as it leaves each stage.
    pub images: Vec<(String, Vec<u8>)>,
}

/// Skipped samples listed on the page (the rest are counted).
pub const MAX_SKIPPED_SHOWN: usize = 1000;

/// One colour per stage, in stage order (distinct in light and dark themes).
const PALETTE: [&str; 8] = [
    "#1f77b4", "#e8710a", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn mib(b: f64) -> f64 {
    b / (1024.0 * 1024.0)
}

/// A "nice" upper bound for an axis.
fn nice_max(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * p {
            return m * p;
        }
    }
    10.0 * p
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The throughput line: each point is the rate over the interval that
/// ends there, so the first one's rate is drawn from the start of the run
/// too (a run shorter than one interval still gets a line, not a dot).
fn throughput_line(pts: &[TimelinePoint]) -> Vec<(f64, f64)> {
    let mut line = Vec::with_capacity(pts.len() + 1);
    if let Some(first) = pts.first().filter(|p| p.t_s > 0.0) {
        line.push((0.0, first.samples_per_s));
    }
    line.extend(pts.iter().map(|p| (p.t_s, p.samples_per_s)));
    line
}

/// One line of a plot: label, colour, `(x, y)` points.
type Series = (String, String, Vec<(f64, f64)>);

/// A line plot: `series` of `(label, colour, points)`, optional dashed
/// horizontal `limit`, axes labelled with units.
struct Plot<'a> {
    title: &'a str,
    x_unit: &'a str,
    y_unit: &'a str,
    series: Vec<Series>,
    limit: Option<(String, f64)>,
    step: bool,
}

const W: f64 = 640.0;
const H: f64 = 220.0;
const L: f64 = 64.0;
const R: f64 = 16.0;
const T: f64 = 28.0;
const B: f64 = 40.0;

impl Plot<'_> {
    fn svg(&self) -> String {
        let xs = self.series.iter().flat_map(|s| s.2.iter().map(|p| p.0));
        let x_max = nice_max(xs.fold(0.0, f64::max));
        let ys = self.series.iter().flat_map(|s| s.2.iter().map(|p| p.1));
        let data_top = ys.fold(0.0, f64::max);
        // A limit far above the data (a 1 GiB budget over 50 MiB in flight)
        // would flatten it: past 4× the data it is named, not drawn.
        let limit = self
            .limit
            .as_ref()
            .filter(|l| data_top <= 0.0 || l.1 <= 4.0 * data_top);
        let y_top = limit.map_or(data_top, |l| l.1.max(data_top));
        let y_max = nice_max(y_top * 1.05);
        let px = |x: f64| L + (x / x_max) * (W - L - R);
        let py = |y: f64| H - B - (y / y_max) * (H - T - B);
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<figure><svg viewBox="0 0 {W} {H}" role="img" aria-label="{t}"><title>{t}</title>"#,
            t = esc(self.title)
        );
        let _ = write!(
            s,
            r#"<text class="ttl" x="{L}" y="16">{}</text>"#,
            esc(self.title)
        );
        for i in 0..=4 {
            let v = y_max * f64::from(i) / 4.0;
            let y = py(v);
            let _ = write!(
                s,
                r#"<line class="grid" x1="{L}" x2="{}" y1="{y:.1}" y2="{y:.1}"/><text class="tick" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                W - R,
                L - 6.0,
                y + 4.0,
                fmt_num(v)
            );
        }
        for i in 0..=4 {
            let v = x_max * f64::from(i) / 4.0;
            let x = px(v);
            let _ = write!(
                s,
                r#"<text class="tick" x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
                H - B + 16.0,
                fmt_num(v)
            );
        }
        let _ = write!(
            s,
            r#"<line class="axis" x1="{L}" x2="{L}" y1="{T}" y2="{}"/><line class="axis" x1="{L}" x2="{}" y1="{y0}" y2="{y0}"/>"#,
            H - B,
            W - R,
            y0 = H - B
        );
        let _ = write!(
            s,
            r#"<text class="unit" x="{}" y="{}" text-anchor="middle">{}</text><text class="unit" transform="translate(14 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (L + W - R) / 2.0,
            H - 6.0,
            esc(self.x_unit),
            (T + H - B) / 2.0,
            esc(self.y_unit)
        );
        if let (Some((label, v)), None) = (&self.limit, limit) {
            let _ = write!(
                s,
                r#"<text class="tick" x="{}" y="{}" text-anchor="end">{} {} (above the plot)</text>"#,
                W - R,
                T + 12.0,
                esc(label),
                fmt_num(*v)
            );
        }
        if let Some((label, v)) = limit {
            let y = py(*v);
            let _ = write!(
                s,
                r#"<line class="limit" x1="{L}" x2="{}" y1="{y:.1}" y2="{y:.1}"/><text class="tick" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                W - R,
                W - R,
                y - 4.0,
                esc(label)
            );
        }
        for (label, colour, pts) in &self.series {
            let mut d = String::new();
            let mut last: Option<(f64, f64)> = None;
            for &(x, y) in pts {
                if self.step {
                    if let Some((_, ly)) = last {
                        let _ = write!(d, "{:.1},{:.1} ", px(x), py(ly));
                    }
                }
                let _ = write!(d, "{:.1},{:.1} ", px(x), py(y));
                last = Some((x, y));
            }
            let _ = write!(
                s,
                r#"<polyline class="series" fill="none" stroke="{colour}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
                d.trim_end(),
                esc(label)
            );
        }
        s.push_str("</svg><figcaption>");
        for (label, colour, _) in &self.series {
            let _ = write!(
                s,
                r#"<span class="key"><i style="background:{colour}"></i>{}</span>"#,
                esc(label)
            );
        }
        s.push_str("</figcaption></figure>");
        s
    }
}

const STYLE: &str = r#"
:root { color-scheme: light dark; --fg:#1d1d1f; --bg:#ffffff; --mute:#6b6b70; --grid:#e3e3e8; --card:#f5f5f7; }
@media (prefers-color-scheme: dark) { :root { --fg:#ececf0; --bg:#16161a; --mute:#a0a0a8; --grid:#33333a; --card:#212127; } }
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 24px auto; max-width: 1320px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 8px; }
.head { display: flex; gap: 16px; flex-wrap: wrap; margin: 12px 0; }
.head div { background: var(--card); border-radius: 8px; padding: 10px 14px; min-width: 150px; }
.head b { display: block; font-size: 20px; } .advice { background: var(--card); border-left: 4px solid #e8710a; padding: 8px 12px; }
table { border-collapse: collapse; } td, th { padding: 4px 10px; text-align: right; border-bottom: 1px solid var(--grid); }
td:first-child, th:first-child { text-align: left; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 16px; }
figure { margin: 0; background: var(--card); border-radius: 8px; padding: 8px; }
svg { width: 100%; height: auto; display: block; } svg text { fill: var(--fg); font-size: 12px; }
.ttl { font-weight: 600; font-size: 13px; } .tick, .unit { fill: var(--mute); }
.grid { stroke: var(--grid); } .axis { stroke: var(--mute); } .limit { stroke: #d62728; stroke-dasharray: 6 4; }
figcaption { font-size: 12px; color: var(--mute); } .key { margin-right: 12px; white-space: nowrap; }
.key i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: -1px; }
.strip { display: flex; gap: 12px; flex-wrap: wrap; } .strip figure { text-align: center; } .strip img { max-height: 180px; image-rendering: auto; }
.mute { color: var(--mute); }
"#;

impl ReportPage {
    /// A page of `pipeline`'s figures since its last metrics reset, with the
    /// epoch summary's samples, stall and skipped samples.
    pub fn from_pipeline(pipeline: &Pipeline, summary: &EpochSummary, title: &str) -> Self {
        ReportPage {
            title: title.to_string(),
            unit: "samples".into(),
            samples: summary.samples,
            batches: summary.batches,
            seconds: summary.seconds,
            data_stall_seconds: summary.wait_seconds,
            stages: pipeline.stage_reports(),
            bottleneck: pipeline.bottleneck(),
            timeline: pipeline.timeline(),
            max_bytes_in_flight: pipeline.budget().max() as u64,
            peak_bytes_in_flight: pipeline.budget().peak() as u64,
            epochs: vec![(
                summary.epoch,
                summary.samples as f64 / summary.seconds.max(1e-9),
            )],
            skipped: summary
                .skipped
                .iter()
                .map(|e| (e.index, e.path.clone(), e.stage.clone(), e.kind.to_string()))
                .collect(),
            resources: Vec::new(),
            images: Vec::new(),
        }
    }

    /// The colour of stage (or pool) `name`: its first stage's place in
    /// the stage table.
    fn colour(&self, name: &str) -> String {
        let first = name.split('+').next().unwrap_or(name);
        let i = self
            .stages
            .iter()
            .position(|s| s.name == first)
            .unwrap_or(self.stages.len());
        PALETTE[i % PALETTE.len()].to_string()
    }

    /// The whole page.
    pub fn render(&self) -> String {
        let mut h = String::with_capacity(64 << 10);
        let rate = self.samples as f64 / self.seconds.max(1e-9);
        let stall = 100.0 * self.data_stall_seconds / self.seconds.max(1e-9);
        let _ = write!(
            h,
            "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>{}</title><style>{STYLE}</style></head><body>",
            esc(&self.title)
        );
        let _ = write!(
            h,
            "<h1>{}</h1><div class=\"mute\">{} {} in {} batches, {:.2} s</div>",
            esc(&self.title),
            self.samples,
            esc(&self.unit),
            self.batches,
            self.seconds
        );
        let _ = write!(
            h,
            "<div class=\"head\"><div>throughput<b>{} {}/s</b></div><div>data stall<b>{:.1}% of the run</b></div><div>peak in flight<b>{:.1} MiB</b>of {:.1} MiB budget</div><div>bottleneck<b>{}</b></div><div>skipped<b>{}</b></div></div>",
            fmt_num(rate),
            esc(&self.unit),
            stall.min(100.0),
            mib(self.peak_bytes_in_flight as f64),
            mib(self.max_bytes_in_flight as f64),
            self.bottleneck.as_ref().map_or("—".to_string(), |b| esc(&b.stage)),
            self.skipped.len()
        );
        if let Some(b) = &self.bottleneck {
            let _ = write!(h, "<p class=\"advice\">{}</p>", esc(&b.advice));
        }
        h.push_str("<h2>Stages</h2><table><tr><th>stage</th><th>workers</th><th>samples</th><th>busy</th><th>CPU</th><th>mean ms</th><th>p50 ms</th><th>p99 ms</th><th>errors</th><th>skipped</th><th>retries</th><th>queue fill</th></tr>");
        for s in &self.stages {
            let _ = write!(
                h,
                "<tr><td><span class=\"key\"><i style=\"background:{}\"></i>{}</span></td><td>{}</td><td>{}</td><td>{:.0}%</td><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                self.colour(&s.name),
                esc(&s.name),
                s.workers,
                s.samples,
                s.busy_fraction * 100.0,
                s.cpu_fraction.map_or("—".into(), |c| format!("{:.0}%", c * 100.0)),
                s.mean_ms,
                s.p50_ms,
                s.p99_ms,
                s.errors,
                s.skipped,
                s.retries,
                s.input_queue_fill.map_or("—".into(), |f| format!("{:.0}%", f * 100.0)),
            );
        }
        h.push_str("</table><h2>Over time</h2><div class=\"plots\">");
        let pts = &self.timeline.points;
        let plots = [
            Plot {
                title: "throughput",
                x_unit: "time (s)",
                y_unit: &format!("{}/s", self.unit),
                series: vec![(
                    "collated".into(),
                    self.colour("collate"),
                    throughput_line(pts),
                )],
                limit: None,
                step: false,
            },
            Plot {
                title: "queue fill",
                x_unit: "time (s)",
                y_unit: "fill (%)",
                series: {
                    let mut v: Vec<_> = self
                        .timeline
                        .queues
                        .iter()
                        .enumerate()
                        .map(|(i, q)| {
                            (
                                format!("into {q}"),
                                self.colour(q),
                                pts.iter()
                                    .map(|p| {
                                        (
                                            p.t_s,
                                            100.0
                                                * p.input_queue_fill.get(i).copied().unwrap_or(0.0),
                                        )
                                    })
                                    .collect(),
                            )
                        })
                        .collect();
                    v.push((
                        "batches ready for the consumer".into(),
                        "#7f7f7f".into(),
                        pts.iter()
                            .map(|p| (p.t_s, 100.0 * p.output_queue_fill))
                            .collect(),
                    ));
                    v
                },
                limit: None,
                step: false,
            },
            Plot {
                title: "bytes in flight",
                x_unit: "time (s)",
                y_unit: "MiB",
                series: vec![(
                    "in flight".into(),
                    PALETTE[0].into(),
                    pts.iter()
                        .map(|p| (p.t_s, mib(p.bytes_in_flight as f64)))
                        .collect(),
                )],
                limit: Some(("budget MiB".into(), mib(self.max_bytes_in_flight as f64))),
                step: false,
            },
            Plot {
                title: "workers per pool",
                x_unit: "time (s)",
                y_unit: "workers",
                series: self
                    .timeline
                    .pools
                    .iter()
                    .enumerate()
                    .map(|(i, pool)| {
                        (
                            pool.clone(),
                            self.colour(pool),
                            pts.iter()
                                .map(|p| (p.t_s, p.workers.get(i).copied().unwrap_or(0) as f64))
                                .collect(),
                        )
                    })
                    .collect(),
                limit: None,
                step: true,
            },
        ];
        for p in &plots {
            h.push_str(&p.svg());
        }
        // One plot per meter (a reader's bytes downloaded: MB/s).
        for (i, name) in self.timeline.meters.iter().enumerate() {
            let (unit, scale) = if name.contains("bytes") {
                ("MB/s", 1e-6)
            } else {
                ("per second", 1.0)
            };
            h.push_str(
                &Plot {
                    title: name,
                    x_unit: "time (s)",
                    y_unit: unit,
                    series: vec![(
                        name.clone(),
                        PALETTE[3].into(),
                        pts.iter()
                            .filter_map(|p| p.meter_rates.get(i).map(|r| (p.t_s, r * scale)))
                            .collect(),
                    )],
                    limit: None,
                    step: false,
                }
                .svg(),
            );
        }
        if self.epochs.len() > 1 {
            h.push_str(
                &Plot {
                    title: "per-epoch rate",
                    x_unit: "epoch",
                    y_unit: &format!("{}/s", self.unit),
                    series: vec![(
                        "epoch rate".into(),
                        PALETTE[2].into(),
                        self.epochs.iter().map(|&(e, r)| (e as f64, r)).collect(),
                    )],
                    limit: None,
                    step: false,
                }
                .svg(),
            );
        }
        h.push_str("</div>");
        if !self.epochs.is_empty() {
            h.push_str("<h2>Epochs</h2><table><tr><th>epoch</th><th>rate</th></tr>");
            for (e, r) in &self.epochs {
                let _ = write!(
                    h,
                    "<tr><td>{e}</td><td>{} {}/s</td></tr>",
                    fmt_num(*r),
                    esc(&self.unit)
                );
            }
            h.push_str("</table>");
        }
        if !self.images.is_empty() {
            h.push_str("<h2>A sample through the stages</h2><div class=\"strip\">");
            for (stage, png) in &self.images {
                let _ = write!(
                    h,
                    "<figure><img alt=\"{s}\" src=\"data:image/png;base64,{}\"><figcaption>{s}</figcaption></figure>",
                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, png),
                    s = esc(stage)
                );
            }
            h.push_str("</div>");
        }
        let _ = write!(h, "<h2>Skipped samples ({})</h2>", self.skipped.len());
        if self.skipped.is_empty() {
            h.push_str("<p class=\"mute\">none</p>");
        } else {
            h.push_str("<table><tr><th>index</th><th>path</th><th>stage</th><th>error</th></tr>");
            for (i, p, st, e) in self.skipped.iter().take(MAX_SKIPPED_SHOWN) {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    i.map_or("—".into(), |i| i.to_string()),
                    esc(p.as_deref().unwrap_or("—")),
                    esc(st),
                    esc(e)
                );
            }
            h.push_str("</table>");
            if self.skipped.len() > MAX_SKIPPED_SHOWN {
                let _ = write!(
                    h,
                    "<p class=\"mute\">and {} more</p>",
                    self.skipped.len() - MAX_SKIPPED_SHOWN
                );
            }
        }
        if !self.resources.is_empty() {
            h.push_str("<h2>Resources</h2><table>");
            for (k, v) in &self.resources {
                let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", esc(k), esc(v));
            }
            h.push_str("</table>");
        }
        h.push_str("</body></html>\n");
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(points: usize, skipped: usize) -> ReportPage {
        let stage = |name: &str| StageReport {
            name: name.into(),
            workers: 2,
            samples: 100,
            busy_fraction: 0.5,
            mean_ms: 1.0,
            p50_ms: 1.0,
            p99_ms: 2.0,
            errors: 0,
            skipped: 0,
            retries: 0,
            cpu_fraction: Some(0.9),
            input_queue_fill: None,
        };
        ReportPage {
            title: "ferrofeed <test>".into(),
            unit: "images".into(),
            samples: 1000,
            batches: 10,
            seconds: 2.0,
            data_stall_seconds: 0.5,
            stages: vec![stage("source"), stage("decode"), stage("collate")],
            timeline: Timeline {
                interval_s: 0.1,
                queues: vec!["collate".into()],
                pools: vec!["source+decode".into(), "collate".into()],
                meters: vec![],
                points: (0..points)
                    .map(|i| TimelinePoint {
                        t_s: (i + 1) as f64 * 0.1,
                        samples_per_s: 500.0 + (i % 7) as f64 * 10.0,
                        bytes_in_flight: (i as u64 % 50) << 20,
                        output_queue_fill: 0.5,
                        input_queue_fill: vec![0.25],
                        workers: vec![2, 1],
                        meter_rates: vec![],
                    })
                    .collect(),
            },
            max_bytes_in_flight: 64 << 20,
            peak_bytes_in_flight: 49 << 20,
            epochs: vec![(0, 400.0), (1, 600.0)],
            skipped: (0..skipped)
                .map(|i| {
                    (
                        Some(i as u64),
                        Some(format!("f{i}.jpg")),
                        "decode".into(),
                        "bad <data>".into(),
                    )
                })
                .collect(),
            resources: vec![("CPUs".into(), "2 (cgroup)".into())],
            images: vec![("decode".into(), vec![137, 80, 78, 71])],
            ..Default::default()
        }
    }

    #[test]
    fn a_full_timeline_stays_small_and_self_contained() {
        let html = page(Timeline::MAX_POINTS, 1500).render();
        assert!(html.len() <= 2 << 20, "{} bytes", html.len());
        for bad in [
            "http://", "https://", "src=\"//", "href=", "@import", "<script", "<link",
        ] {
            assert!(!html.contains(bad), "{bad}");
        }
        assert_eq!(html.matches("<svg").count(), 5);
        // Every timeline point is in the throughput line, after its start.
        assert_eq!(throughput_points(&html).len(), Timeline::MAX_POINTS + 1);
        assert!(html.contains("and 500 more"));
        assert!(html.contains("ferrofeed &lt;test&gt;") && html.contains("bad &lt;data&gt;"));
        assert!(html.contains("data:image/png;base64,iVBORw=="));
    }

    /// The `x,y` pairs of the page's first line (the throughput).
    fn throughput_points(html: &str) -> Vec<String> {
        let line = html.split("<polyline").nth(1).unwrap();
        let pts = line.split("points=\"").nth(1).unwrap();
        let pts = pts.split('"').next().unwrap();
        pts.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn a_run_shorter_than_one_interval_draws_its_rate_from_the_start() {
        let html = page(1, 0).render();
        let pts = throughput_points(&html);
        assert_eq!(pts.len(), 2, "{pts:?}");
        let (x0, y0) = pts[0].split_once(',').unwrap();
        let (x1, y1) = pts[1].split_once(',').unwrap();
        // From the plot's left edge to the point, at the point's rate.
        assert_eq!(x0, format!("{L:.1}"));
        assert!(x1.parse::<f64>().unwrap() > x0.parse::<f64>().unwrap());
        assert_eq!(y0, y1);
    }

    #[test]
    fn a_stage_keeps_its_colour_in_every_plot() {
        let p = page(10, 0);
        let html = p.render();
        let decode = p.colour("decode");
        // The table swatch, the workers plot (pool source+decode takes the
        // source's colour; decode alone would take its own).
        assert_eq!(p.colour("source+decode"), p.colour("source"));
        assert!(html.contains(&format!("background:{decode}")));
        assert_ne!(p.colour("collate"), decode);
        assert!(html.contains(&format!("stroke=\"{}\"", p.colour("collate"))));
    }

    #[test]
    fn a_meter_gets_its_own_plot_in_mb_per_s() {
        let mut p = page(10, 0);
        p.timeline.meters = vec!["bytes downloaded".into()];
        for (i, pt) in p.timeline.points.iter_mut().enumerate() {
            pt.meter_rates = vec![i as f64 * 1e6];
        }
        let plain = page(10, 0).render();
        let html = p.render();
        assert_eq!(
            html.matches("<svg").count(),
            plain.matches("<svg").count() + 1
        );
        assert!(html.contains("bytes downloaded") && html.contains("MB/s"));
        // 0–9 MB/s: the axis reaches 10.
        let plot = &html[html.find("bytes downloaded").unwrap()..];
        let plot = &plot[..plot.find("</svg>").unwrap()];
        assert!(plot.contains(">10<") || plot.contains(">10.0<"), "{plot}");
    }
}
