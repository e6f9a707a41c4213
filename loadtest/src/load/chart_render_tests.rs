//! Rendering synthetic charts and reading the PNGs back: a valid file of the right size,
//! not blank, with the event line and every series drawn.

use super::*;
use crate::load::charts::Line;

fn spec(log_y: bool, lines: Vec<Line>) -> ChartSpec {
    ChartSpec {
        file: "test.png",
        title: "synthetic: 0123456789 ms".into(),
        y_label: "y",
        log_y,
        lines,
    }
}

fn line(label: &str, points: &[(f64, f64)]) -> Line {
    Line {
        label: label.into(),
        segments: vec![points.to_vec()],
    }
}

/// Renders and decodes: (width, height, RGB pixels).
fn render(spec: &ChartSpec) -> (u32, u32, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(spec.file);
    png(spec, &path, (400, 240)).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let decoder = ::png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, ::png::ColorType::Rgb);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

fn count(pixels: &[u8], color: RGBColor) -> usize {
    pixels
        .chunks_exact(3)
        .filter(|p| (p[0], p[1], p[2]) == (color.0, color.1, color.2))
        .count()
}

/// Pixels of `color` left of the legend column (so a legend entry alone does not count).
fn count_in_plot(pixels: &[u8], width: u32, color: RGBColor) -> usize {
    let plot = (width - width / 3) as usize;
    pixels
        .chunks_exact(3)
        .enumerate()
        .filter(|(i, p)| {
            i % width as usize <= plot && (p[0], p[1], p[2]) == (color.0, color.1, color.2)
        })
        .count()
}

/// The most pixels of `color` in one column.
fn tallest_column(pixels: &[u8], width: u32, color: RGBColor) -> usize {
    let w = width as usize;
    let mut per_col = vec![0usize; w];
    for (i, p) in pixels.chunks_exact(3).enumerate() {
        if (p[0], p[1], p[2]) == (color.0, color.1, color.2) {
            per_col[i % w] += 1;
        }
    }
    per_col.into_iter().max().unwrap_or(0)
}

#[test]
fn a_chart_is_a_png_of_the_asked_size_with_its_lines_and_the_event() {
    let s = spec(
        false,
        vec![
            line("pod-0", &[(-2.0, 100.0), (0.0, 100.0), (3.0, 0.0)]),
            line("pod-1", &[(-2.0, 0.0), (1.0, 50.0), (3.0, 100.0)]),
        ],
    );
    let (w, h, px) = render(&s);
    assert_eq!((w, h), (400, 240));
    let white = count(&px, WHITE);
    let total = (w * h) as usize;
    assert!(white < total, "blank chart");
    assert!(white > total / 2, "mostly background: {white} of {total}");
    for i in 0..2 {
        assert!(
            count_in_plot(&px, w, line_color(i)) > 200,
            "series {i} not drawn"
        );
    }
    // The legend column lists both series and the event.
    let legend = |c: RGBColor| count(&px, c) - count_in_plot(&px, w, c);
    assert!(legend(line_color(1)) > 20 && legend(EVENT_COLOR) > 20);
    // The dashed event line: a vertical run of red pixels across much of the plot.
    assert!(
        tallest_column(&px, w, EVENT_COLOR) > 60,
        "event line missing: {}",
        tallest_column(&px, w, EVENT_COLOR)
    );
}

#[test]
fn log_axis_and_empty_charts_render_too() {
    let (w, _, px) = render(&spec(
        true,
        vec![line("p99", &[(-1.5, 0.5), (0.5, 4_000.0)])],
    ));
    assert!(count_in_plot(&px, w, line_color(0)) > 200);
    // No data at all: still a valid chart (axes, caption, event), not an error.
    let (w, h, px) = render(&spec(false, vec![]));
    assert_eq!((w, h), (400, 240));
    assert!(count(&px, WHITE) < px.len() / 3);
    assert!(tallest_column(&px, w, EVENT_COLOR) > 60);
}
