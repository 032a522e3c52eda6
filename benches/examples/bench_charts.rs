//! Draws the performance report's charts (docs/performance.md) from the
//! last criterion run:
//!
//! * `docs/charts/scale.svg`: the median time to replay the last 100 events
//!   of one stream against the number of events in the store, per backend,
//!   beside the linear-scan reference (rmcp's test store strategy);
//! * `docs/charts/follow-latency.svg`: the median and 99th percentile time
//!   from an append's return on one handle to the event's delivery to a
//!   follower on another, per backend.
//!
//! ```text
//! cargo bench -p mcp-event-store-benches --bench scale
//! cargo bench -p mcp-event-store-benches --bench follow
//! cargo run -p mcp-event-store-benches --example bench_charts           # reads target/criterion
//! cargo run -p mcp-event-store-benches --example bench_charts -- DIR    # another criterion directory
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// Every backend's name, in `mcp_event_store::backends()` order.
fn backends() -> Vec<&'static str> {
    mcp_event_store::backends()
        .iter()
        .map(|backend| backend.name)
        .collect()
}

const SIZES: [(&str, f64); 4] = [("1k", 1e3), ("10k", 1e4), ("100k", 1e5), ("1M", 1e6)];

type Failure = Box<dyn std::error::Error>;

/// Every benchmark of the run: full id to median nanoseconds.
fn medians(root: &Path) -> Result<BTreeMap<String, f64>, Failure> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            }
        }
        if !dir.ends_with("new") || !dir.join("benchmark.json").exists() {
            continue;
        }
        let bench: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("benchmark.json"))?)?;
        let estimates: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("estimates.json"))?)?;
        if let (Some(id), Some(median)) = (
            bench["full_id"].as_str(),
            estimates["median"]["point_estimate"].as_f64(),
        ) {
            out.insert(id.to_owned(), median);
        }
    }
    Ok(out)
}

fn colour(i: usize) -> RGBColor {
    [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(90, 90, 90),
    ][i % 6]
}

fn scale_chart(data: &BTreeMap<String, f64>, out: &Path) -> Result<bool, Failure> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for backend in backends() {
        let points: Vec<(f64, f64)> = SIZES
            .iter()
            .filter_map(|(label, n)| {
                data.get(&format!("scale/{backend}/store/{label}"))
                    .map(|ns| (*n, ns / 1e6))
            })
            .collect();
        if !points.is_empty() {
            series.push((backend.to_owned(), points));
        }
    }
    let reference: Vec<(f64, f64)> = SIZES
        .iter()
        .filter_map(|(label, n)| {
            data.get(&format!("scale/memory/rmcp_linear_vec/{label}"))
                .map(|ns| (*n, ns / 1e6))
        })
        .collect();
    if !reference.is_empty() {
        series.push(("linear scan (rmcp's test store)".into(), reference));
    }
    if series.is_empty() {
        return Ok(false);
    }
    let (lo, hi) = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.1))
        .fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let root = SVGBackend::new(out, (760, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Replay the last 100 events of a stream, by events in the store",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (5e2f64..2e6f64).log_scale(),
            ((lo / 2.0).max(1e-4)..hi * 2.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("events in the store")
        .y_desc("median per replay (ms)")
        .x_label_formatter(&|x| match *x {
            x if x >= 1e6 => format!("{}M", x / 1e6),
            x if x >= 1e3 => format!("{}k", x / 1e3),
            x => format!("{x}"),
        })
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let style = colour(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.clone(), style))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(
            points
                .iter()
                .map(|&p| Circle::new(p, 3, colour(i).filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(true)
}

fn follow_chart(root_dir: &Path, out: &Path) -> Result<bool, Failure> {
    let mut bars: Vec<(&str, f64, f64)> = Vec::new();
    for backend in backends() {
        let file = root_dir
            .join("follow")
            .join(backend)
            .join("latency")
            .join("percentiles.json");
        let Ok(text) = std::fs::read(&file) else {
            continue;
        };
        let json: serde_json::Value = serde_json::from_slice(&text)?;
        let ms = |key: &str| json[key].as_f64().unwrap_or(0.0) / 1e6;
        bars.push((backend, ms("median_ns"), ms("p99_ns")));
    }
    if bars.is_empty() {
        return Ok(false);
    }
    // Log scale: the backends span microseconds (in process) to tens of
    // milliseconds (SQLite's poll across handles).
    let top = bars.iter().map(|b| b.2).fold(0.0, f64::max) * 2.0;
    let floor = bars.iter().map(|b| b.1).fold(f64::MAX, f64::min).max(1e-4) / 2.0;
    let root = SVGBackend::new(out, (760, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Follow latency: append on one handle to delivery on another",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            0f64..bars.len() as f64,
            (floor..top.max(floor * 10.0)).log_scale(),
        )?;
    let names: Vec<&str> = bars.iter().map(|b| b.0).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let at = x.floor() as usize;
            if (x - at as f64 - 0.5).abs() < 0.01 {
                names.get(at).map(|n| n.to_string()).unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("milliseconds (log scale)")
        .draw()?;
    for (k, (label, pick)) in [("median", 0usize), ("p99", 1usize)]
        .into_iter()
        .enumerate()
    {
        let fill = colour(k).filled();
        chart
            .draw_series(bars.iter().enumerate().map(|(i, bar)| {
                let value = if pick == 0 { bar.1 } else { bar.2 };
                let x0 = i as f64 + 0.15 + 0.35 * k as f64;
                Rectangle::new([(x0, floor), (x0 + 0.33, value.max(floor))], fill)
            }))?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], fill));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(true)
}

fn main() -> Result<(), Failure> {
    let criterion: PathBuf = match std::env::args_os().nth(1) {
        Some(dir) => dir.into(),
        None => mcp_event_store_benches::criterion_dir(),
    };
    if !criterion.is_dir() {
        return Err(format!(
            "no criterion results in {}: run `cargo bench -p mcp-event-store-benches \
             --bench scale` and `cargo bench -p mcp-event-store-benches --bench follow` first",
            criterion.display()
        )
        .into());
    }
    // The workspace's docs/charts, beside docs/performance.md, which shows
    // them.
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/charts");
    std::fs::create_dir_all(&out)?;
    let data = medians(&criterion)?;
    for (drawn, file) in [
        (scale_chart(&data, &out.join("scale.svg"))?, "scale.svg"),
        (
            follow_chart(&criterion, &out.join("follow-latency.svg"))?,
            "follow-latency.svg",
        ),
    ] {
        if drawn {
            println!("wrote docs/charts/{file}");
        } else {
            println!(
                "skipped docs/charts/{file}: no results for it in {}",
                criterion.display()
            );
        }
    }
    Ok(())
}
