//! The request path, from a client's side: start the gateway, create a key, call it, look at
//! what the backend saw.

#[path = "../common/mod.rs"]
mod common;
mod connections;
mod keys_lifecycle;
mod requests;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::io::{Read, Write};
use svcgate::keys::Environment;
