//! Properties of the parsers a client or a backend feeds: keys, credits, signatures, routes
//! and configuration. Each holds for any input proptest makes (and shrinks on failure); the
//! fuzz targets in `fuzz/` drive the same parsers with coverage guidance.

mod config;
mod credits;
mod keys;
mod routes;
mod signatures;
