//! Headless Chromium driven over WebDriver: chromedriver on a free port, one session per test.

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::process::{Child, Command, Stdio};

use crate::common::{free_port, wait_for_port};

/// A browser session; chromedriver is stopped on drop.
pub struct Browser {
    pub client: Client,
    driver: Child,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Chromium, headless, in a window `width` pixels wide.
    pub async fn start(width: u32) -> Self {
        let port = free_port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts (apt-get install chromium-driver)");
        wait_for_port(port, "chromedriver").await;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", format!("--window-size={width},900")],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a WebDriver session");
        Self { client, driver }
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// Types `text` into the field with id `id`.
    pub async fn fill(&self, id: &str, text: &str) {
        let field = self.client.find(Locator::Id(id)).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Clicks the (first) submit button whose text is `text`, and waits for the next page.
    pub async fn press(&self, text: &str) {
        let xpath = format!("//button[normalize-space(.)='{text}']");
        let button = self
            .client
            .find(Locator::XPath(&xpath))
            .await
            .unwrap_or_else(|_| panic!("a button '{text}'"));
        self.navigating(button).await;
    }

    /// Clicks the link whose text is `text`, and waits for the next page.
    pub async fn follow(&self, text: &str) {
        let link = self
            .client
            .find(Locator::LinkText(text))
            .await
            .unwrap_or_else(|_| panic!("a link '{text}'"));
        self.navigating(link).await;
    }

    /// Clicks `element` and waits until another document has loaded: the old one is marked
    /// first, and the wait ends when a complete document without the mark is there.
    async fn navigating(&self, element: fantoccini::elements::Element) {
        self.client
            .execute("window.svcgateOldPage = true", vec![])
            .await
            .unwrap();
        element.click().await.unwrap();
        for _ in 0..100 {
            let loaded = self
                .client
                .execute(
                    "return !window.svcgateOldPage && document.readyState === 'complete'",
                    vec![],
                )
                .await
                .ok()
                .and_then(|v| v.as_bool())
                .unwrap_or(false);
            if loaded {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("no page loaded after the click");
    }

    /// Checks the checkbox with value `value` of the boxes named `name`.
    pub async fn check(&self, name: &str, value: &str) {
        let css = format!("input[name='{name}'][value='{value}']");
        self.client
            .find(Locator::Css(&css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    /// Chooses the option with value `value` of the select with id `id`.
    pub async fn choose(&self, id: &str, value: &str) {
        self.client
            .find(Locator::Id(id))
            .await
            .unwrap()
            .select_by_value(value)
            .await
            .unwrap();
    }

    /// The value of the input with id `id`.
    pub async fn value(&self, id: &str) -> String {
        self.client
            .find(Locator::Id(id))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap()
            .unwrap_or_default()
    }

    pub async fn source(&self) -> String {
        self.client.source().await.unwrap()
    }

    /// Waits (up to 10 s) for the page at `path` to be loaded, after a click that navigates.
    pub async fn wait_for_path(&self, path: &str) {
        for _ in 0..100 {
            if self.path().await == path {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "the browser is at {}, not {path}: {}",
            self.path().await,
            self.source().await
        );
    }

    pub async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_string()
    }

    /// How wide the page is laid out, in CSS pixels.
    pub async fn scroll_width(&self) -> u64 {
        self.client
            .execute("return document.documentElement.scrollWidth", vec![])
            .await
            .unwrap()
            .as_u64()
            .unwrap()
    }

    /// The viewport's width, in CSS pixels.
    pub async fn inner_width(&self) -> u64 {
        self.client
            .execute("return window.innerWidth", vec![])
            .await
            .unwrap()
            .as_u64()
            .unwrap()
    }

    /// Writes a screenshot of the page to `$SVCGATE_DASHBOARD_SCREENSHOTS/<name>.png` when that
    /// variable names a directory.
    pub async fn screenshot(&self, name: &str) {
        let Ok(dir) = std::env::var("SVCGATE_DASHBOARD_SCREENSHOTS") else {
            return;
        };
        let png = self.client.screenshot().await.unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }
}
