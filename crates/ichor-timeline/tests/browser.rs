//! The picture in a real browser: Debian's headless Chromium renders the SVG to a PNG,
//! which must show the chart (many colours, the phases' among them), not a blank page.
//!
//! Needs `/usr/bin/chromium` (`.ci/run` installs it). Without it the test says so and
//! passes, except under CI (`CI` set), where a missing browser is a failure.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ichor_timeline::{Options, Phase, Timeline, draw, render};

const CHROMIUM: &str = "/usr/bin/chromium";
/// Chromium's own limit is far lower; this only keeps a hung browser from hanging the run.
const BROWSER_DEADLINE: Duration = Duration::from_secs(120);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ichor-timeline-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Renders `page` with headless Chromium into `png`, at `width` x `height`.
fn screenshot(page: &Path, png: &Path, width: u32, height: u32, profile: &Path) {
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            // Loopback only: no host name resolves, any connection goes to a closed
            // loopback port (the page is a local file and needs neither).
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9",
            "--no-pings",
            "--disable-domain-reliability",
            "--disable-breakpad",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                std::io::Read::read_to_string(&mut pipe, &mut stderr).ok();
            }
            assert!(status.success(), "chromium exited {status}: {stderr}");
            return;
        }
        if started.elapsed() > BROWSER_DEADLINE {
            child.kill().ok();
            child.wait().ok();
            panic!("chromium did not finish within {BROWSER_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The RGB pixels of a PNG, with its size.
fn pixels(png: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "an RGB screenshot, got {:?}", info.color_type);
    let pixels = buf[..info.buffer_size()].chunks(channels).map(|p| [p[0], p[1], p[2]]).collect();
    (info.width, info.height, pixels)
}

fn rgb(hex: &str) -> [u8; 3] {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap();
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

#[test]
#[ignore = "needs Chromium at /usr/bin/chromium (apt-get install chromium; .ci/run installs it)"]
fn chromium_renders_the_timeline_as_a_picture_not_a_blank_page() {
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: apt-get install chromium (.ci/run installs it)");
    let dir = scratch("browser");
    let timeline = Timeline::from_records(&common::trace(3, 40, 5));
    let document = render(&timeline, &Options { bound_s: Some(6000.0), ..Options::default() });
    let text = document.to_string();
    let svg = dir.join("timeline.svg");
    std::fs::write(&svg, &text).unwrap();
    let height: f64 =
        roxmltree::Document::parse(&text).unwrap().root_element().attribute("height").unwrap().parse().unwrap();
    let png = dir.join("timeline.png");
    screenshot(&svg, &png, 1200, height.ceil() as u32, &dir.join("profile"));

    let (width, tall, pixels) = pixels(&png);
    assert_eq!((width, tall), (1200, height.ceil() as u32), "the screenshot has the window's size");
    let white = pixels.iter().filter(|p| **p == [255, 255, 255]).count();
    let drawn = pixels.len() - white;
    assert!(drawn * 10 > pixels.len(), "more than a tenth of the picture is drawn: {drawn} of {}", pixels.len());
    let mut distinct: Vec<[u8; 3]> = pixels.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 20, "a picture, not a flat page: {} colours", distinct.len());
    for phase in [Phase::Evacuating, Phase::Installing, Phase::Rebooting, Phase::Verifying, Phase::Converged] {
        let colour = rgb(draw::colour(phase));
        let count = pixels.iter().filter(|p| **p == colour).count();
        assert!(count > 100, "{} bars ({}) are on the picture: {count} pixels", phase.label(), draw::colour(phase));
    }
    std::fs::remove_dir_all(&dir).ok();
}
