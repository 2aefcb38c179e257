//! The route table: which `/v1` operations are served, and the scope and price of each.

use http::Method;

use super::config::RouteConfig;
use crate::metering::Credits;

use super::webhooks::WebhookOp;

/// Who answers a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// The backend (or the simulator).
    Forward,
    /// The gateway mints a scoped token (`POST /v1/tokens`).
    MintToken,
    /// The gateway's webhook endpoints API.
    Webhooks(WebhookOp),
    /// The stream of events behind `svcgate listen` (`GET /v1/webhooks/listen`).
    Listen,
}

/// The scopes of the routes the gateway answers itself (tokens, webhooks), sorted.
pub fn built_in_scopes() -> Vec<&'static str> {
    let mut scopes: Vec<&'static str> = BUILT_IN.iter().map(|r| r.2).collect();
    scopes.sort_unstable();
    scopes.dedup();
    scopes
}

/// Routes the gateway answers itself; configured routes cannot take their paths.
/// (A static segment wins over a parameter, so `/v1/webhooks/listen` is not an endpoint id.)
const BUILT_IN: [(&str, &str, &str, Handler); 14] = [
    ("POST", "/v1/tokens", "tokens:create", Handler::MintToken),
    (
        "GET",
        "/v1/webhooks/listen",
        "webhooks:read",
        Handler::Listen,
    ),
    (
        "GET",
        "/v1/webhooks",
        "webhooks:read",
        Handler::Webhooks(WebhookOp::List),
    ),
    (
        "POST",
        "/v1/webhooks",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::Create),
    ),
    (
        "GET",
        "/v1/webhooks/{id}",
        "webhooks:read",
        Handler::Webhooks(WebhookOp::Get),
    ),
    (
        "PATCH",
        "/v1/webhooks/{id}",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::Update),
    ),
    (
        "DELETE",
        "/v1/webhooks/{id}",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::Delete),
    ),
    (
        "POST",
        "/v1/webhooks/{id}/resume",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::Resume),
    ),
    (
        "GET",
        "/v1/webhooks/{id}/deliveries",
        "webhooks:read",
        Handler::Webhooks(WebhookOp::Deliveries),
    ),
    (
        "POST",
        "/v1/webhooks/{id}/replay",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::Replay),
    ),
    (
        "POST",
        "/v1/webhooks/{id}/rotate-secret",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::RotateSecret),
    ),
    (
        "POST",
        "/v1/webhooks/{id}/deliveries/{delivery_id}/retry",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::RetryDelivery),
    ),
    (
        "POST",
        "/v1/webhooks/{id}/test",
        "webhooks:write",
        Handler::Webhooks(WebhookOp::Test),
    ),
    (
        "GET",
        "/v1/webhooks/event-types",
        "webhooks:read",
        Handler::Webhooks(WebhookOp::EventTypes),
    ),
];

/// One served operation.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// The method it answers.
    pub method: Method,
    /// The path template, e.g. `/v1/agents/runs/{id}/approve`; also the metrics label.
    pub template: Box<str>,
    /// The scope a key needs.
    pub scope: Box<str>,
    /// Credits charged when the backend reports none.
    pub price: Credits,
    /// Who answers it.
    pub handler: Handler,
    /// Whether it takes protocol upgrades (`Upgrade`, WebSocket).
    pub upgrade: bool,
    /// Credits reserved against budgets while a request is in flight, if not the price.
    pub reserve: Option<Credits>,
    /// Its metric series.
    pub metrics: crate::metrics::RouteMetrics,
}

impl Route {
    /// The credits charged for a success when the backend reports none: the route's price,
    /// nothing for a `HEAD` (the `GET` route's answer without its body: nothing was made).
    pub fn price_for(&self, method: &Method) -> Credits {
        match *method == Method::HEAD {
            true => Credits::ZERO,
            false => self.price,
        }
    }

    /// The credits a request reserves against its budgets while in flight: the route's
    /// `reserve`, or its price; nothing for a `HEAD`, which is never charged.
    pub fn reserve_for(&self, method: &Method) -> Credits {
        match *method == Method::HEAD {
            true => Credits::ZERO,
            false => self.reserve.unwrap_or(self.price),
        }
    }
}

/// A route's place in its table. A request keeps this, not a counted reference to the route,
/// which every request on the route would increment and decrement from every core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteId(usize);

/// Method + path → [`Route`], with a radix tree per method.
#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<Route>,
    by_method: Vec<(Method, matchit::Router<usize>)>,
}

impl RouteTable {
    /// Builds the table; fails on a bad method or two routes claiming the same path.
    pub fn new(configs: &[RouteConfig]) -> Result<Self, String> {
        let mut table = RouteTable {
            routes: Vec::with_capacity(configs.len()),
            by_method: Vec::new(),
        };
        let built_in = BUILT_IN.iter().map(|(method, path, scope, handler)| {
            (
                RouteConfig {
                    method: method.to_string(),
                    path: path.to_string(),
                    scope: scope.to_string(),
                    price: Credits::ZERO,
                    upgrade: false,
                    reserve: None,
                },
                *handler,
            )
        });
        let configured = configs.iter().map(|c| (c.clone(), Handler::Forward));
        for (config, handler) in built_in.chain(configured) {
            let method = config
                .method
                .to_ascii_uppercase()
                .parse::<Method>()
                .map_err(|_| format!("'{}' is not an HTTP method", config.method))?;
            let index = table.routes.len();
            let router = match table.by_method.iter_mut().find(|(m, _)| *m == method) {
                Some((_, router)) => router,
                None => {
                    table
                        .by_method
                        .push((method.clone(), matchit::Router::new()));
                    &mut table.by_method.last_mut().expect("just pushed").1
                }
            };
            router
                .insert(config.path.as_str(), index)
                .map_err(|e| format!("{} {}: {e}", method, config.path))?;
            table.routes.push(Route {
                method,
                template: config.path.as_str().into(),
                scope: config.scope.as_str().into(),
                price: config.price,
                handler,
                upgrade: config.upgrade,
                reserve: config.reserve,
                metrics: crate::metrics::RouteMetrics::new(&config.path),
            });
        }
        Ok(table)
    }

    /// The route serving `method` on `path`, if any.
    #[inline]
    pub fn find(&self, method: &Method, path: &str) -> Option<&Route> {
        self.find_id(method, path).map(|id| self.get(id))
    }

    /// Where in this table the route serving `method` on `path` is, if there is one. `HEAD`
    /// is served by the `GET` route of the path unless a route names `HEAD` (RFC 9110 §9.3.2:
    /// the same answer without its body, which Pingora leaves out), except the event stream.
    #[inline]
    pub fn find_id(&self, method: &Method, path: &str) -> Option<RouteId> {
        match self.find_in(method, path) {
            None if *method == Method::HEAD => self
                .find_in(&Method::GET, path)
                .filter(|id| self.get(*id).handler != Handler::Listen),
            found => found,
        }
    }

    fn find_in(&self, method: &Method, path: &str) -> Option<RouteId> {
        let (_, router) = self.by_method.iter().find(|(m, _)| m == method)?;
        let matched = router.at(path).ok()?;
        // `{id}` must name something: `/v1/agents/runs//approve` is not a route. Nor is a
        // dot-segment, or a parameter with an encoded dot, slash or backslash: a backend that
        // normalizes `/v1/agents/runs/../approve` serves `/v1/agents/approve`, which is not the
        // route whose scope was checked. A catch-all parameter (`{*path}`) spans segments:
        // each of them is held to the same rule.
        if matched
            .params
            .iter()
            .any(|(_, value)| !value.split('/').all(is_plain_segment))
        {
            return None;
        }
        Some(RouteId(*matched.value))
    }

    /// The route `id`, found in this table.
    pub fn get(&self, id: RouteId) -> &Route {
        &self.routes[id.0]
    }

    /// Every route, built-in ones first, then the configured ones in their order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
}

/// Whether a path parameter names something, the same way for the gateway and any backend: not
/// empty, not `.` or `..`; no `;` (Tomcat, Jetty and Spring read `..;` as `..`) and no `\`
/// (some servers read it as `/`); and no `%2e`, `%2f`, `%5c` or `%3b` (an encoded dot, slash,
/// backslash or semicolon), nor `%25` (an encoded `%`, which a backend that decodes twice
/// turns into any of those).
fn is_plain_segment(value: &str) -> bool {
    if value.is_empty() || value == "." || value == ".." {
        return false;
    }
    let bytes = value.as_bytes();
    if bytes.iter().any(|&b| b == b';' || b == b'\\') {
        return false;
    }
    // Encoded: a dot, slash, percent, backslash or semicolon; a control character (`%00`
    // ends a C string early); or a byte that is never UTF-8 (`%c0`, `%c1`: the overlong forms
    // of `.` and `/` a lenient decoder turns into them).
    !bytes.windows(3).any(|w| {
        w[0] == b'%'
            && matches!(
                (w[1].to_ascii_lowercase(), w[2].to_ascii_lowercase()),
                (b'2', b'e' | b'f' | b'5')
                    | (b'5', b'c')
                    | (b'3', b'b')
                    | (b'0' | b'1', _)
                    | (b'7', b'f')
                    | (b'c', b'0' | b'1')
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::config::default_routes;

    #[test]
    fn default_table_serves_the_default_routes() {
        let t = RouteTable::new(&default_routes()).unwrap();
        let cases = [
            (Method::GET, "/v1/models", "models:read"),
            (
                Method::POST,
                "/v1/chat/completions",
                "chat.completions:create",
            ),
            (Method::POST, "/v1/images/generations", "images:create"),
            (Method::POST, "/v1/images/batches", "images:create"),
            (Method::POST, "/v1/videos", "videos:create"),
            (Method::POST, "/v1/audio/speech", "voice:create"),
            (Method::POST, "/v1/agents/runs", "agents:run"),
            (
                Method::POST,
                "/v1/agents/runs/run_123/approve",
                "agents:run",
            ),
        ];
        for (method, path, scope) in cases {
            let route = t.find(&method, path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!(&*route.scope, scope, "{path}");
        }
        assert_eq!(
            &*t.find(&Method::POST, "/v1/agents/runs/r1/approve")
                .unwrap()
                .template,
            "/v1/agents/runs/{id}/approve"
        );
    }

    #[test]
    fn unknown_paths_and_methods_do_not_match() {
        let t = RouteTable::new(&default_routes()).unwrap();
        assert!(t.find(&Method::GET, "/v1/chat/completions").is_none());
        assert!(t.find(&Method::POST, "/v1/chat").is_none());
        assert!(t.find(&Method::POST, "/v1/chat/completions/x").is_none());
        assert!(t.find(&Method::GET, "/v1/models/").is_none());
        assert!(t.find(&Method::POST, "/v1/agents/runs//approve").is_none());
        for path in [
            "/v1/agents/runs/../approve",
            "/v1/agents/runs/./approve",
            "/v1/agents/runs/%2e%2e/approve",
            "/v1/agents/runs/%2E./approve",
            "/v1/agents/runs/..%2F..%2Fmodels/approve",
            "/v1/agents/runs/a%5cb/approve",
            // Read as `..` by Tomcat, Jetty and Spring; as `/` by some servers; and what a
            // backend that decodes twice turns into `..`.
            "/v1/agents/runs/..;/approve",
            "/v1/agents/runs/.;/approve",
            "/v1/agents/runs/run;jsessionid=1/approve",
            "/v1/agents/runs/..%3b/approve",
            "/v1/agents/runs/a\\b/approve",
            "/v1/agents/runs/%252e%252e/approve",
        ] {
            assert!(t.find(&Method::POST, path).is_none(), "{path}");
        }
        for id in ["run_1", "run.1", "run..1", "run%20one", "%41"] {
            let path = format!("/v1/agents/runs/{id}/approve");
            assert!(t.find(&Method::POST, &path).is_some(), "{path}");
        }
        assert!(t.find(&Method::DELETE, "/v1/models").is_none());
        assert!(t.find(&Method::GET, "").is_none());
    }

    #[test]
    fn a_request_reserves_the_routes_reserve_or_its_price() {
        let route = |price: i64, reserve: Option<i64>| RouteConfig {
            method: "POST".into(),
            path: "/v1/runs".into(),
            scope: "runs:create".into(),
            price: Credits::from_micros(price),
            upgrade: false,
            reserve: reserve.map(Credits::from_micros),
        };
        let t = RouteTable::new(&[route(0, Some(5_000_000))]).unwrap();
        let priced_by_backend = t.find(&Method::POST, "/v1/runs").unwrap();
        assert_eq!(
            priced_by_backend.reserve_for(&Method::POST).micros(),
            5_000_000
        );
        assert_eq!(priced_by_backend.reserve_for(&Method::HEAD), Credits::ZERO);
        let t = RouteTable::new(&[route(2_000_000, None)]).unwrap();
        let priced = t.find(&Method::POST, "/v1/runs").unwrap();
        assert_eq!(priced.reserve_for(&Method::POST).micros(), 2_000_000);
        let negative = crate::proxy::config::validate_routes(&[route(0, Some(-1))]);
        assert_eq!(negative.len(), 1, "{negative:?}");
    }

    #[test]
    fn head_is_served_by_the_get_route_unless_one_names_it() {
        let mut routes = default_routes();
        routes.push(RouteConfig {
            method: "HEAD".into(),
            path: "/v1/files/{id}".into(),
            scope: "files:check".into(),
            price: Credits::ZERO,
            upgrade: false,
            reserve: None,
        });
        routes.push(RouteConfig {
            method: "GET".into(),
            path: "/v1/files/{id}".into(),
            scope: "files:read".into(),
            price: Credits::ZERO,
            upgrade: false,
            reserve: None,
        });
        let t = RouteTable::new(&routes).unwrap();
        let models = t.find(&Method::HEAD, "/v1/models").unwrap();
        assert_eq!(
            (&*models.template, &*models.scope),
            ("/v1/models", "models:read")
        );
        let file = t.find(&Method::HEAD, "/v1/files/f_1").unwrap();
        assert_eq!(&*file.scope, "files:check");
        let endpoint = t.find(&Method::HEAD, "/v1/webhooks/we_1").unwrap();
        assert_eq!(endpoint.handler, Handler::Webhooks(WebhookOp::Get));
        // Not the event stream (it would run with nowhere to write); not POST routes.
        assert!(t.find(&Method::HEAD, "/v1/webhooks/listen").is_none());
        assert!(t.find(&Method::HEAD, "/v1/chat/completions").is_none());
        assert!(t
            .find(&Method::HEAD, "/v1/agents/runs/../approve")
            .is_none());
    }

    #[test]
    fn built_in_routes_cannot_be_taken_over() {
        let t = RouteTable::new(&default_routes()).unwrap();
        let tokens = t.find(&Method::POST, "/v1/tokens").unwrap();
        assert_eq!(tokens.handler, Handler::MintToken);
        assert_eq!(&*tokens.scope, "tokens:create");
        let mut routes = default_routes();
        routes.push(RouteConfig {
            method: "POST".into(),
            path: "/v1/tokens".into(),
            scope: "x:y".into(),
            price: Credits::ZERO,
            upgrade: false,
            reserve: None,
        });
        assert!(RouteTable::new(&routes).is_err());
    }

    #[test]
    fn listen_is_not_taken_for_an_endpoint_id() {
        let t = RouteTable::new(&default_routes()).unwrap();
        let listen = t.find(&Method::GET, "/v1/webhooks/listen").unwrap();
        assert_eq!(
            (listen.handler, &*listen.scope),
            (Handler::Listen, "webhooks:read")
        );
        let get = t.find(&Method::GET, "/v1/webhooks/we_1").unwrap();
        assert_eq!(get.handler, Handler::Webhooks(WebhookOp::Get));
        let delete = t.find(&Method::DELETE, "/v1/webhooks/listen").unwrap();
        assert_eq!(delete.handler, Handler::Webhooks(WebhookOp::Delete));
        assert!(t.find(&Method::GET, "/v1/webhooks/listen/x").is_none());
    }

    #[test]
    fn a_catch_all_parameter_is_held_to_the_segment_rule_in_every_segment() {
        let mut routes = default_routes();
        routes.push(RouteConfig {
            method: "POST".into(),
            path: "/v1/files/{*path}".into(),
            scope: "files:write".into(),
            price: Credits::ZERO,
            upgrade: false,
            reserve: None,
        });
        let t = RouteTable::new(&routes).unwrap();
        let file = t
            .find(&Method::POST, "/v1/files/reports/2026/q3.pdf")
            .unwrap();
        assert_eq!(&*file.scope, "files:write");
        // A backend that normalizes paths would serve the chat route under `files:write`.
        for path in [
            "/v1/files/x/../../chat/completions",
            "/v1/files/x/./y",
            "/v1/files/x//y",
            "/v1/files/x/",
            "/v1/files/x/%2e%2e/y",
            "/v1/files/x/..;/y",
        ] {
            assert!(t.find(&Method::POST, path).is_none(), "{path}");
        }
    }

    #[test]
    fn conflicting_routes_are_refused() {
        let mut routes = default_routes();
        routes.push(routes[0].clone());
        assert!(RouteTable::new(&routes).is_err());
        let mut bad = default_routes();
        bad[0].method = "G ET".into();
        assert!(RouteTable::new(&bad).is_err());
    }
}
