//! `results.png`: one small chart per loss term and metric over epochs, like Ultralytics' plot.

use super::trainer::EpochRecord;
use crate::loss::TERMS;
use plotters::prelude::*;
use std::path::Path;

const WIDTH: u32 = 1600;
const HEIGHT: u32 = 640;
const FONT: &str = "sans-serif";

/// The panels: title and value per epoch (non-finite values are left out of a line).
fn panels(history: &[EpochRecord]) -> Vec<(String, Vec<f64>)> {
    let mut out: Vec<(String, Vec<f64>)> = TERMS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v = history.iter().map(|r| r.train_loss[i]).collect();
            (format!("train/{t}"), v)
        })
        .collect();
    let metric = |name: &str, f: fn(&EpochRecord) -> f64| {
        (name.to_string(), history.iter().map(f).collect::<Vec<_>>())
    };
    out.push(metric("metrics/box_mAP50", |r| r.box_map50));
    out.push(metric("metrics/box_mAP50-95", |r| r.box_map));
    out.push(metric("metrics/pose_mAP50", |r| r.pose_map50));
    out.push(metric("metrics/pose_mAP50-95", |r| r.pose_map));
    out
}

/// Renders the chart grid as RGB pixels (`WIDTH × HEIGHT × 3`).
pub fn render(history: &[EpochRecord]) -> Result<Vec<u8>, String> {
    register_font();
    let mut pixels = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let panels = panels(history);
        let areas = root.split_evenly((2, panels.len().div_ceil(2)));
        for (area, (title, values)) in areas.iter().zip(&panels) {
            draw_panel(area, title, values).map_err(|e| format!("{title}: {e}"))?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(pixels)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    values: &[f64],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let points: Vec<(f64, f64)> = values
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| ((i + 1) as f64, v))
        .collect();
    let (lo, hi) = points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(1e-6 * hi.abs().max(1.0));
    let x_max = (values.len().max(2)) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 16))
        .margin(8)
        .x_label_area_size(22)
        .y_label_area_size(48)
        .build_cartesian_2d(1.0..x_max, (lo - pad)..(hi + pad))?;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(5)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.3}"))
        .label_style((FONT, 11))
        .draw()?;
    chart.draw_series(LineSeries::new(
        points.iter().copied(),
        BLUE.stroke_width(2),
    ))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, BLUE.filled())))?;
    Ok(())
}

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TTF shipped by the crate; failure would be a packaging bug.
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .unwrap_or_else(|_| panic!("the embedded DejaVu Sans font did not parse"));
    });
}

/// Writes `dir/results.png` atomically.
pub fn write_plot(dir: &Path, history: &[EpochRecord]) -> std::io::Result<()> {
    let pixels = render(history).map_err(std::io::Error::other)?;
    let img = image::RgbImage::from_raw(WIDTH, HEIGHT, pixels)
        .ok_or_else(|| std::io::Error::other("plot buffer has the wrong size"))?;
    let mut png = std::io::Cursor::new(Vec::new());
    img.write_to(&mut png, image::ImageFormat::Png)
        .map_err(std::io::Error::other)?;
    super::report::write_atomic(&dir.join("results.png"), png.get_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(epoch: usize, loss: f64, map: f64) -> EpochRecord {
        EpochRecord {
            epoch,
            train_loss: [loss; 6],
            lr: 0.01,
            box_map50: map,
            box_map: map,
            pose_map50: map,
            pose_map: map,
            seconds: 1.0,
            val_seconds: 0.0,
            data_wait: 0.0,
            per_class: Vec::new(),
        }
    }

    /// Non-white pixels whose blue channel dominates: the data line and its markers.
    fn blue_pixels(px: &[u8]) -> usize {
        px.chunks(3)
            .filter(|p| p[2] > 150 && p[0] < 100 && p[1] < 100)
            .count()
    }

    #[test]
    fn writes_a_png_with_a_line_per_panel() {
        let dir = std::env::temp_dir().join(format!("burnpose-plot-{}", std::process::id()));
        let history: Vec<_> = (0..5)
            .map(|e| record(e, 10.0 - e as f64, 0.1 * e as f64))
            .collect();
        write_plot(&dir, &history).unwrap();
        let img = image::open(dir.join("results.png")).unwrap().to_rgb8();
        assert_eq!(img.dimensions(), (WIDTH, HEIGHT));
        // Nothing but the plot is left behind (no temporary file).
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["results.png"]);
        // Every panel carries a drawn line: count blue per panel cell of the 2 × 5 grid.
        let (cw, ch) = (WIDTH / 5, HEIGHT / 2);
        for row in 0..2 {
            for col in 0..5 {
                let n = (0..ch)
                    .flat_map(|y| (0..cw).map(move |x| (col * cw + x, row * ch + y)))
                    .filter(|&(x, y)| {
                        let p = img.get_pixel(x, y);
                        p[2] > 150 && p[0] < 100 && p[1] < 100
                    })
                    .count();
                assert!(n > 200, "panel ({row},{col}) has {n} line pixels");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn single_epoch_and_non_finite_values_render() {
        let mut one = record(0, 5.0, f64::NAN);
        one.train_loss[3] = f64::INFINITY;
        let px = render(&[one]).unwrap();
        // Markers for the finite panels (the four metric panels and one loss are empty).
        assert!(blue_pixels(&px) > 0);
        let empty = render(&[]).unwrap();
        assert_eq!(blue_pixels(&empty), 0);
    }
}
