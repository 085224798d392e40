//! SVG plots (plotters' SVG backend: text is written as SVG <text>, no fonts needed).

use std::path::Path;

use plotters::prelude::*;

use crate::cli::human_size;
use crate::stats::log_histogram;

/// One line of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend.
    pub name: String,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed-looking (thin) as a reference rather than a measurement.
    pub reference: bool,
}

fn bounds(series: &[Series]) -> Option<((f64, f64), (f64, f64))> {
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|p| p.0 > 0.0 && p.1 > 0.0)
        .collect();
    if pts.is_empty() {
        return None;
    }
    let fold = |f: fn(&(f64, f64)) -> f64| {
        pts.iter().map(f).fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)))
    };
    let (x, y) = (fold(|p| p.0), fold(|p| p.1));
    Some(((x.0 / 1.5, x.1 * 1.5), (y.0 / 2.0, y.1 * 2.0)))
}

/// Log-log line plot; x labels as sizes when `x_is_size`. Writes an explanatory empty
/// plot when there is nothing to draw.
pub fn lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    x_is_size: bool,
    series: &[Series],
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(((x0, x1), (y0, y1))) = bounds(series) else {
        root.draw(&Text::new(format!("{title}: no data"), (40, 40), ("sans-serif", 20)))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
        return Ok(());
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let size_fmt = |v: &f64| human_size(v.round() as u64);
    let num_fmt = |v: &f64| format!("{v:.3e}");
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(if x_is_size { &size_fmt } else { &num_fmt })
        .y_label_formatter(&num_fmt)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = if s.reference { color.stroke_width(1) } else { color.stroke_width(3) };
        let pts: Vec<(f64, f64)> =
            s.points.iter().copied().filter(|p| p.0 > 0.0 && p.1 > 0.0).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        if !s.reference {
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Latency histograms (log bins, fraction of iterations per bin) as lines, one per system.
pub fn histogram(path: &Path, title: &str, samples: &[(String, Vec<f64>)]) -> anyhow::Result<()> {
    let series: Vec<Series> = samples
        .iter()
        .map(|(name, v)| {
            let n = v.len().max(1) as f64;
            Series {
                name: format!("{name} ({} iterations)", v.len()),
                points: log_histogram(v, 20)
                    .into_iter()
                    .map(|(a, b, c)| ((a * b).sqrt(), c as f64 / n))
                    .filter(|p| p.1 > 0.0)
                    .collect(),
                reference: false,
            }
        })
        .collect();
    lines(path, title, "latency per iteration (us)", "fraction of iterations", false, &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_svg_with_text() {
        let dir = std::env::temp_dir().join(format!("inc-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.svg");
        let s = Series {
            name: "af_packet".into(),
            points: vec![(4.0, 1e-4), (1024.0, 0.02)],
            reference: false,
        };
        lines(&p, "algbw", "size", "GB/s", true, &[s]).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
        assert!(text.contains("af_packet") && text.contains("<text"));
        let h = dir.join("h.svg");
        histogram(&h, "lat", &[("mpi".into(), vec![100.0, 120.0, 130.0, 900.0])]).unwrap();
        assert!(std::fs::read_to_string(&h).unwrap().contains("mpi (4 iterations)"));
        lines(&dir.join("e.svg"), "empty", "x", "y", true, &[]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
