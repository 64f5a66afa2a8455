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
    assert!((50.0..=100.0).contains(&active), "at most k=100 in turn at once: {active}");
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

/// The texts of `node`'s descendants of `class`, in document order.
fn texts_of(node: roxmltree::Node<'_, '_>, class: &str) -> Vec<String> {
    node.descendants().filter(|n| class_is(n, class)).map(|n| n.text().unwrap_or_default().trim().to_owned()).collect()
}

/// The frame (background) of a band: its top and height.
fn frame(band: roxmltree::Node<'_, '_>) -> (f64, f64) {
    let rect = band.children().find(|n| class_is(n, "frame")).expect("a band's frame");
    (attr(rect, "y"), attr(rect, "height"))
}

#[test]
fn the_density_view_counts_machines_in_turn_against_the_limit_on_labelled_axes() {
    use ichor_timeline::TraceRecord;
    // 3 control planes and 1,200 workers in pools of 20; each worker pulls its image
    // from 400 s to 100 s before its turn, so that more pull at once than the limit.
    let mut records = common::trace(3, 1200, 20);
    let starts: Vec<(String, f64)> = records
        .iter()
        .filter(|r| r.role == "worker" && r.event == "evacuation-start")
        .map(|r| (r.node.clone(), r.t))
        .collect();
    for (node, t0) in &starts {
        records.push(TraceRecord::new(t0 - 400.0, node, "worker", "image-pull-start"));
        records.push(TraceRecord::new(t0 - 100.0, node, "worker", "image-pulled"));
    }
    records.sort_by(|a, b| a.t.total_cmp(&b.t));
    let timeline = Timeline::from_records(&records);
    let options = Options { max_unavailable: Some(20), ..Options::default() };
    let svg = render(&timeline, &options).to_string();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
    let bands: Vec<_> = doc.descendants().filter(|n| class_is(n, "band")).collect();
    assert_eq!(bands.len(), 2);
    let (control_planes, workers) = (bands[0], bands[1]);

    // Only the machines in their turn count against the limit: at most 20, where the
    // early pulls alone reach more than 20 at once, counted in their own strip.
    let in_turn = attr(workers, "data-most-active");
    assert!((10.0..=20.0).contains(&in_turn), "machines in turn at most maxUnavailable: {in_turn}");
    let waiting = workers.children().find(|n| class_is(n, "waiting")).expect("a strip of machines ahead of turn");
    assert!(attr(waiting, "data-most") > 20.0, "the early pulls, apart: {}", attr(waiting, "data-most"));
    assert!(waiting.children().any(|n| class_is(&n, "area") && n.attribute("data-phase") == Some("pulling")));
    assert!(
        workers.children().filter(|n| class_is(n, "area")).all(|n| n.attribute("data-phase") != Some("pulling")),
        "no pulling area among the machines in turn"
    );

    // The limit's line, where 20 is on the left axis, whose ticks are labelled.
    let (y, height) = frame(workers);
    let axis_top = attr(workers, "data-axis-top");
    assert_eq!(axis_top, 20.0);
    let limit = workers.children().find(|n| class_is(n, "limit")).expect("the maxUnavailable line");
    assert_eq!(attr(limit, "data-limit"), 20.0);
    let line = limit.children().find(|n| n.tag_name().name() == "line").unwrap();
    assert!((attr(line, "y1") - (y + height - 20.0 / axis_top * height)).abs() < 0.5, "the line at 20");
    assert!(limit.descendants().any(|n| n.text().map(str::trim) == Some("maxUnavailable 20")));
    let ticks: Vec<String> =
        workers.children().filter(|n| class_is(n, "y-tick")).map(|n| n.text().unwrap().trim().to_owned()).collect();
    assert_eq!(ticks, ["0", "5", "10", "15", "20"]);
    // The share done has its own scale, on the right, and says so.
    assert_eq!(texts_of(workers, "share-tick"), ["0%", "50%", "100%"]);
    assert!(texts_of(workers, "band-label").contains(&"line: share done (right)".to_owned()));
    assert!(texts_of(workers, "band-label").contains(&"ahead of turn".to_owned()));

    // The control planes: a panel their size, on an axis of all three, one at a time.
    let (_, cp_height) = frame(control_planes);
    assert!(cp_height * 3.0 < height, "three machines get a small panel: {cp_height} against {height}");
    assert_eq!(attr(control_planes, "data-axis-top"), 3.0);
    assert_eq!(attr(control_planes, "data-most-active"), 1.0);
    let cp_ticks: Vec<String> = control_planes
        .children()
        .filter(|n| class_is(n, "y-tick"))
        .map(|n| n.text().unwrap().trim().to_owned())
        .collect();
    assert_eq!(cp_ticks, ["0", "1", "2", "3"]);
    let cp_limit = control_planes.children().find(|n| class_is(n, "limit")).expect("one at a time");
    assert_eq!(attr(cp_limit, "data-limit"), 1.0);

    // With no maxUnavailable given, the workers' axis follows the most in turn, and no
    // limit is drawn for them.
    let svg = render(&timeline, &Options::default()).to_string();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let workers = doc.descendants().filter(|n| class_is(n, "band")).nth(1).unwrap();
    assert!(workers.children().all(|n| !class_is(&n, "limit")));
    assert!(attr(workers, "data-axis-top") >= attr(workers, "data-most-active"));
}
