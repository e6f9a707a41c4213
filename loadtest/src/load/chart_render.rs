//! Drawing a [`ChartSpec`] as a PNG with plotters' bitmap backend.
//!
//! Text goes through plotters' `ab_glyph` renderer with the DejaVu Sans subset bundled
//! in `loadtest/assets/` (license beside it), registered once as the `sans-serif`
//! family: plotters' default `ttf` feature would look fonts up through font-kit and
//! fontconfig, which CI machines may lack.

use std::{ops::Range, path::Path, sync::OnceLock};

use plotters::{
    coord::ranged1d::{AsRangedCoord, ValueFormatter},
    prelude::*,
};

use super::{ChartError, ChartSpec};

/// Width and height of every chart, pixels.
pub const SIZE: (u32, u32) = (1000, 500);
/// The event marker's colour (tests look for it).
pub const EVENT_COLOR: RGBColor = RED;

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans-subset.ttf");

/// Registers the bundled font once per process.
fn font() -> Result<(), ChartError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    ok.then_some(()).ok_or(ChartError::Font)
}

/// The colour of line `i` (matplotlib's tab20 order: ten strong colours, then their
/// light partners, so up to 20 pods are told apart); the event's pure red is not among
/// them.
pub fn line_color(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 20] = [
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(0, 0, 0),
        RGBColor(174, 199, 232),
        RGBColor(152, 223, 138),
        RGBColor(197, 176, 213),
        RGBColor(255, 187, 120),
        RGBColor(196, 156, 148),
        RGBColor(247, 182, 210),
        RGBColor(199, 199, 199),
        RGBColor(219, 219, 141),
        RGBColor(158, 218, 229),
        RGBColor(255, 152, 150),
    ];
    COLORS[i % COLORS.len()]
}

/// x and y ranges covering every point and the event (x = 0), with a little head-room.
fn ranges(spec: &ChartSpec) -> (Range<f64>, Range<f64>) {
    let (mut x0, mut x1, mut y0, mut y1) = (0.0f64, 0.0f64, f64::MAX, f64::MIN);
    for (x, y) in spec.points() {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if y0 > y1 {
        // No data: an empty chart with sane axes (the caption still says what it is).
        (y0, y1) = (1.0, 1.0);
    }
    let y = if spec.log_y {
        y0.max(0.5) / 1.5..(y1 * 1.5).max(10.0)
    } else {
        let low = y0.min(0.0);
        low..y1 + (y1 - low).max(1.0) * 0.08
    };
    (x0 - 0.5..x1.max(x0 + 1.0) + 0.5, y)
}

/// An axis label: whole numbers without decimals, others with one.
fn tick(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Draws `spec` into `path` as a PNG of `size` pixels.
pub fn png(spec: &ChartSpec, path: &Path, size: (u32, u32)) -> Result<(), ChartError> {
    font()?;
    let (x, y) = ranges(spec);
    let err = |e: &dyn std::fmt::Display| ChartError::Draw {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    // The legend gets its own column: inside the plot it hides lines (every pod sits
    // near the top of the sessions chart, for instance).
    let legend_width = LEGEND_WIDTH.min(size.0 / 3);
    let (plot, side) = root.split_horizontally(size.0 - legend_width);
    if spec.log_y {
        draw(spec, &plot, x, y.clone().log_scale(), y).map_err(|e| err(&e))?;
    } else {
        draw(spec, &plot, x, y.clone(), y).map_err(|e| err(&e))?;
    }
    legend(spec, &side).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

/// Width of the legend column, pixels.
const LEGEND_WIDTH: u32 = 150;

/// One row per line (its colour and label), then the event marker; a second column
/// when the rows do not fit (a rolling restart of 20 pods draws 40).
fn legend<'a>(spec: &ChartSpec, area: &Area<'a>) -> DrawResult<'a> {
    let (width, height) = area.dim_in_pixel();
    let entries: Vec<(&str, RGBColor)> = spec
        .lines
        .iter()
        .enumerate()
        .map(|(i, l)| (l.label.as_str(), line_color(i)))
        .chain([("event", EVENT_COLOR)])
        .collect();
    let rows = (height.saturating_sub(60) / 20).max(1) as usize;
    let columns = entries.len().div_ceil(rows);
    let column_width = (width as usize / columns.max(1)) as i32;
    for (n, (label, color)) in entries.into_iter().enumerate() {
        let (x, y) = (
            (n / rows) as i32 * column_width,
            48 + 20 * (n % rows) as i32,
        );
        area.draw(&PathElement::new(
            [(x + 4, y), (x + 24, y)],
            color.stroke_width(2),
        ))?;
        area.draw(&Text::new(
            label.to_owned(),
            (x + 30, y - 7),
            ("sans-serif", 13).into_font().color(&BLACK),
        ))?;
    }
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
type DrawResult<'a> =
    Result<(), DrawingAreaErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>>;

/// The chart itself, generic over a linear or logarithmic y axis (`y_span` is its range
/// in data units, for the event line).
fn draw<'a, Y>(
    spec: &ChartSpec,
    root: &Area<'a>,
    x: Range<f64>,
    y: Y,
    y_span: Range<f64>,
) -> DrawResult<'a>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(&spec.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the event")
        .y_desc(spec.y_label)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, line) in spec.lines.iter().enumerate() {
        let color = line_color(i);
        for seg in &line.segments {
            chart.draw_series(LineSeries::new(seg.iter().copied(), color.stroke_width(2)))?;
        }
    }
    let event = [(0.0, y_span.start), (0.0, y_span.end)];
    chart.draw_series(DashedLineSeries::new(
        event,
        8,
        4,
        EVENT_COLOR.stroke_width(2),
    ))?;
    Ok(())
}

#[cfg(test)]
#[path = "chart_render_tests.rs"]
mod tests;
