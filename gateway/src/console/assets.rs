//! The web console's static files (gateway/console/), embedded in the binary
//! so that the gateway serves them without reading the file system or
//! fetching anything at run time.
//!
//! [`get`] looks a path up in a fixed table of the known files, by exact
//! match: a path that is not one of them, `../` and encoded variants
//! included, is simply not found, so no path can reach outside the table.

/// Each embedded file: its path under /console/, its bytes, its content type.
macro_rules! assets {
    ($($path:literal => $kind:expr),* $(,)?) => {
        const ASSETS: &[(&str, &[u8], &str)] = &[
            $(($path, include_bytes!(concat!("../../console/", $path)), $kind)),*
        ];
    };
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
const SVG: &str = "image/svg+xml";

assets! {
    "index.html" => HTML,
    "console.css" => CSS,
    "favicon.svg" => SVG,
    "console.js" => JS,
    "api.js" => JS,
    "router.js" => JS,
    "dom.js" => JS,
    "format.js" => JS,
    "chart.js" => JS,
    "sampler.js" => JS,
    "pages/signin.js" => JS,
    "pages/streams.js" => JS,
    "pages/stream.js" => JS,
    "pages/event.js" => JS,
    "pages/subscriptions.js" => JS,
    "pages/webhooks.js" => JS,
    "pages/worker.js" => JS,
    "vendor/uPlot.iife.min.js" => JS,
    "vendor/uPlot.min.css" => CSS,
    "vendor/uPlot.LICENSE" => TEXT,
}

/// The bytes and content type of the console file at `path` (what follows
/// /console/; empty: index.html), or None for anything that is not exactly
/// one of the embedded files.
pub fn get(path: &str) -> Option<(&'static [u8], &'static str)> {
    let path = if path.is_empty() { "index.html" } else { path };
    ASSETS.iter().find(|(known, _, _)| *known == path).map(|(_, bytes, kind)| (*bytes, *kind))
}

#[cfg(test)]
mod tests {
    use super::{get, ASSETS};

    #[test]
    fn known_files_are_found_with_their_content_type() {
        let (html, kind) = get("index.html").unwrap();
        assert!(kind.starts_with("text/html"));
        assert!(std::str::from_utf8(html).unwrap().contains("/console/console.js"));
        assert_eq!(get("").unwrap().0, html, "the console's root is index.html");
        assert_eq!(get("pages/streams.js").unwrap().1, "text/javascript; charset=utf-8");
        assert_eq!(get("vendor/uPlot.min.css").unwrap().1, "text/css; charset=utf-8");
        assert!(get("vendor/uPlot.iife.min.js").is_some());
    }

    #[test]
    fn anything_else_is_not_found() {
        for path in [
            "../Cargo.toml",
            "../../Cargo.toml",
            "pages/../index.html",
            "./index.html",
            "/index.html",
            "%2e%2e/Cargo.toml",
            "index.html/",
            "INDEX.HTML",
            "pages",
            "vendor/",
            "vendor/README",
            "//index.html",
            "index.html\0",
            "src/console/assets.rs",
        ] {
            assert!(get(path).is_none(), "{path:?} is not a console file");
        }
    }

    #[test]
    fn every_module_an_embedded_module_imports_is_embedded() {
        // A module the table forgot would be a 404 in the browser: caught here.
        for (path, bytes, _) in ASSETS.iter().filter(|(p, _, _)| p.ends_with(".js") && !p.starts_with("vendor/")) {
            let text = std::str::from_utf8(bytes).unwrap();
            let dir: Vec<&str> = path.rsplit_once('/').map(|(d, _)| d.split('/').collect()).unwrap_or_default();
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let Some(target) = line.split('"').nth(1) else { continue };
                let mut parts = dir.clone();
                for part in target.split('/') {
                    match part {
                        "." => {}
                        ".." => {
                            parts.pop();
                        }
                        other => parts.push(other),
                    }
                }
                let resolved = parts.join("/");
                assert!(get(&resolved).is_some(), "{path} imports {target} ({resolved}), which is not embedded");
            }
        }
    }

    #[test]
    fn the_page_loads_only_embedded_files() {
        let html = std::str::from_utf8(get("index.html").unwrap().0).unwrap();
        for reference in html.split(['"']).filter(|s| s.starts_with("/console/")) {
            let path = reference.trim_start_matches("/console/");
            assert!(get(path).is_some(), "index.html loads {reference}, which is not embedded");
        }
        assert!(
            !html.contains("<script>") && !html.contains("style="),
            "no inline script or style (the CSP forbids them)"
        );
    }
}
