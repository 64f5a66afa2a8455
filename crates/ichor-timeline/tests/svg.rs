//! The SVG as a reader sees it: well-formed XML, one row per machine, bars in time order
//! and within the axis, density bands at thousands of machines.

use crate::common;

use ichor_timeline::{Options, Phase, Timeline, render};

fn draw(control_planes: usize, workers: usize, k: usize, bound: Option<f64>) -> (Timeline, String) {
    let timeline = Timeline::from_records(&common::trace(control_planes, workers, k));
    let svg = render(&timeline, &Options { bound_s: bound, ..Options::default() }).to_string();
    (timeline, svg)
}

fn attr(node: roxmltree::Node<'_, '_>, name: &str) -> f64 {
    node.attribute(name).unwrap_or_else(|| panic!("no {name} on {node:?}")).parse().unwrap()
}

fn class_is(node: &roxmltree::Node<'_, '_>, class: &str) -> bool {
    node.attribute("class") == Some(class)
}

#[test]
fn two_hundred_machines_draw_one_row_each_with_bars_in_order_within_the_axis() {
    let (timeline, svg) = draw(3, 200, 10, Some(5000.0));
    let doc = roxmltree::Document::parse(&svg).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"));

    let axis = doc.descendants().find(|n| class_is(n, "axis")).expect("an axis");
    let (x0, x1, t1) = (attr(axis, "data-x0"), attr(axis, "data-x1"), attr(axis, "data-t1"));
    assert!(t1 >= timeline.end, "the axis covers the whole trace");

    let rows: Vec<_> = doc.descendants().filter(|n| class_is(n, "row")).collect();
    assert_eq!(rows.len(), 203, "one row per machine");
    let names: Vec<&str> = rows.iter().map(|r| r.attribute("data-node").unwrap()).collect();
    assert_eq!(&names[..3], ["cp-1", "cp-2", "cp-3"], "control planes first");
    assert!(rows[3..].iter().all(|r| r.attribute("data-role") == Some("worker")));
    assert_eq!(rows[3].attribute("data-group"), Some("wave 1"));
    assert_eq!(rows[202].attribute("data-group"), Some("wave 20"), "200 workers in waves of 10");

    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.key()).collect();
    for row in &rows {
        let bars: Vec<_> = row.children().filter(|n| class_is(n, "bar")).collect();
        assert!(bars.len() >= 5, "{:?} has its phases", row.attribute("data-node"));
        let mut last_end = 0.0;
        for bar in &bars {
            assert!(phases.contains(&bar.attribute("data-phase").unwrap()));
            let (start, end) = (attr(*bar, "data-start"), attr(*bar, "data-end"));
            assert!(start >= last_end - 1e-9 && end >= start, "bars in time order");
            last_end = end;
            let (x, w) = (attr(*bar, "x"), attr(*bar, "width"));
            assert!(x >= x0 - 1e-6 && x + w <= x1 + 0.02, "bar [{x}, {}] within the axis [{x0}, {x1}]", x + w);
        }
    }
    // Rows are thin at 200 machines: names every few rows, not on each.
    let labels = doc.descendants().filter(|n| class_is(n, "label")).count();
    let every: usize = doc
        .descendants()
        .find(|n| class_is(n, "rows"))
        .unwrap()
        .attribute("data-label-every")
        .unwrap()
        .parse()
        .unwrap();
    assert!(every > 1, "labels every {every} rows");
    assert_eq!(labels, 203usize.div_ceil(every));

    let bound = doc.descendants().find(|n| class_is(n, "bound")).expect("the bound's line");
    let line = bound.children().find(|n| n.tag_name().name() == "line").unwrap();
    let expected = x0 + 5000.0 / t1 * (x1 - x0);
    assert!((attr(line, "x1") - expected).abs() < 0.5, "the bound at its time");

    let markers: Vec<&str> =
        doc.descendants().filter(|n| class_is(n, "marker")).map(|n| n.attribute("data-kind").unwrap()).collect();
    for kind in ["etcd-snapshot", "controller-restart", "etcd-gate"] {
        assert!(markers.contains(&kind), "a {kind} marker in {markers:?}");
    }
    assert!(doc.descendants().any(|n| class_is(&n, "span") && n.attribute("data-kind") == Some("api-outage")));
    let ticks: Vec<String> =
        doc.descendants().filter(|n| class_is(n, "tick")).map(|n| n.text().unwrap().trim().to_owned()).collect();
    assert_eq!(ticks[0], "0:00");
    assert!(ticks.len() >= 4 && ticks.len() <= 13, "a readable axis: {ticks:?}");
    assert!(ticks.iter().all(|t| t.split(':').count() == 2), "hours and minutes: {ticks:?}");
}

#[test]
fn five_thousand_machines_draw_a_density_band_per_role() {
    let (timeline, svg) = draw(5, 5000, 100, None);
    assert_eq!(timeline.rows.len(), 5005);
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    assert_eq!(doc.descendants().filter(|n| class_is(n, "row")).count(), 0, "no row per machine");
    let bands: Vec<_> = doc.descendants().filter(|n| class_is(n, "band")).collect();
    let roles: Vec<(&str, f64)> =
        bands.iter().map(|b| (b.attribute("data-role").unwrap(), attr(*b, "data-machines"))).collect();
    assert_eq!(roles, [("control-plane", 5.0), ("worker", 5000.0)]);
    let workers = bands[1];
    let most = |phase: &str| {
        workers
            .children()
            .find(|n| class_is(n, "area") && n.attribute("data-phase") == Some(phase))
            .map_or(0.0, |n| attr(n, "data-most"))
    };
    assert!(most("rebooting") > 50.0 && most("rebooting") <= 100.0, "up to k=100 rebooting at once");
    let active = attr(workers, "data-most-active");
    assert!((100.0..=200.0).contains(&active), "the areas scale to the most in flight: {active}");
    let done = workers.children().find(|n| class_is(n, "share") && n.attribute("data-phase") == Some("done"));
    assert_eq!(done.map(|n| attr(n, "data-most")), Some(5000.0), "all converged at the end");
    assert!(svg.len() < 1 << 20, "the picture stays small: {} bytes", svg.len());
}

#[test]
fn text_from_the_trace_is_escaped() {
    let mut records = common::trace(1, 2, 1);
    records
        .push(ichor_timeline::TraceRecord::new(2000.0, "worker-1", "worker", "failed").with_reason("Bad<&>\"reason\""));
    let timeline = Timeline::from_records(&records);
    let svg = render(&timeline, &Options { title: "a <b> & c".to_owned(), ..Options::default() }).to_string();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML despite markup in the input");
    assert!(doc.descendants().any(|n| n.text().map(str::trim) == Some("a <b> & c")));
}

/// The subtitle's text and the title's lines of a drawing.
fn heading(svg: &str) -> (Vec<String>, String) {
    let doc = roxmltree::Document::parse(svg).unwrap();
    let texts = |class: &str| -> Vec<String> {
        doc.descendants()
            .filter(|n| class_is(n, class))
            .map(|n| n.text().unwrap_or_default().trim().to_owned())
            .collect()
    };
    (texts("title"), texts("subtitle").concat())
}

#[test]
fn the_subtitle_says_how_the_run_ended_and_a_long_title_wraps() {
    use ichor_timeline::TraceRecord;
    // Completed: every machine converged.
    let records = common::trace(2, 2, 1);
    let timeline = Timeline::from_records(&records);
    let done = timeline.rows.iter().filter_map(|m| m.finished).fold(0.0, f64::max);
    let (_, subtitle) = heading(&render(&timeline, &Options::default()).to_string());
    let expected = format!("completed at {}; 4 machines", ichor_timeline::clock(done));
    assert!(subtitle.starts_with(&expected), "{subtitle:?} against {expected:?}");

    // Paused, the pause standing at the end, one worker never converged: the pause, not
    // a last convergence.
    let mut records: Vec<TraceRecord> = common::trace(2, 2, 1).into_iter().filter(|r| r.node != "worker-2").collect();
    records.push(TraceRecord::new(100.0, "worker-2", "worker", "upgrade-call"));
    records.push(TraceRecord::new(150.0, "worker-2", "worker", "failed").with_reason("AbFallback"));
    records.push(TraceRecord::new(151.0, "operation", "operation", "paused").with_reason("MachineFailed"));
    records.sort_by(|a, b| a.t.total_cmp(&b.t));
    let (_, subtitle) = heading(&render(&Timeline::from_records(&records), &Options::default()).to_string());
    assert!(subtitle.starts_with("paused at 0:02:31: MachineFailed;"), "{subtitle}");
    assert!(!subtitle.contains("converged at"), "{subtitle}");

    // Cut short: neither.
    let mut records = common::trace(2, 2, 1);
    records.retain(|r| !(r.node == "worker-2" && r.event == "converged"));
    let (_, subtitle) = heading(&render(&Timeline::from_records(&records), &Options::default()).to_string());
    assert!(subtitle.starts_with("ended at ") && subtitle.contains("with 3 of 4 converged"), "{subtitle}");

    // A title longer than the picture is wide wraps at words, every word kept.
    let title = "talos-production/upgrade-to-v1.14.4: the median run of the plan drawn from the history of \
                 the last completed upgrade of the production cluster, with every machine";
    let options = Options { title: title.to_owned(), width: 600.0, ..Options::default() };
    let (lines, _) = heading(&render(&Timeline::from_records(&common::trace(2, 2, 1)), &options).to_string());
    assert!(lines.len() >= 2, "{lines:?}");
    assert!(lines.iter().all(|l| l.chars().count() <= 68), "each line fits 600 px: {lines:?}");
    assert_eq!(lines.join(" "), title.split_whitespace().collect::<Vec<_>>().join(" "));
}
