//! The event catalog: every event type with a description and a JSON Schema (draft 2020-12)
//! of its `data`, from one file (`event_types.json`) that the gateway's
//! `GET /v1/webhooks/event-types` answers and the OpenAPI document's `webhooks` section shows.

use serde::Deserialize;
use std::sync::LazyLock;

/// One event type of the catalog.
#[derive(Debug, Clone, Deserialize)]
pub struct EventType {
    /// Its name, one of [`crate::events::EVENT_TYPES`].
    #[serde(rename = "type")]
    pub event_type: String,
    /// When it fires.
    pub description: String,
    /// The JSON Schema of its `data`.
    pub schema: serde_json::Value,
}

static CATALOG_JSON: &str = include_str!("event_types.json");

static CATALOG: LazyLock<Vec<EventType>> = LazyLock::new(|| {
    serde_json::from_str(CATALOG_JSON).expect("event_types.json is checked by a unit test")
});

/// Every event type, in the order of [`crate::events::EVENT_TYPES`].
pub fn event_types() -> &'static [EventType] {
    &CATALOG
}

/// The catalog entry of `event_type`.
pub fn event_type(event_type: &str) -> Option<&'static EventType> {
    CATALOG.iter().find(|t| t.event_type == event_type)
}

/// `{"data": [{"type", "description", "schema"}]}`, as the API answers it.
pub fn catalog_body() -> serde_json::Value {
    let data: serde_json::Value =
        serde_json::from_str(CATALOG_JSON).expect("event_types.json is checked by a unit test");
    serde_json::json!({ "data": data })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EVENT_TYPES;

    #[test]
    fn the_catalog_lists_every_event_type_once_in_order_with_an_object_schema() {
        let names: Vec<&str> = event_types()
            .iter()
            .map(|t| t.event_type.as_str())
            .collect();
        assert_eq!(names, EVENT_TYPES);
        for t in event_types() {
            assert_eq!(t.schema["type"], "object", "{}", t.event_type);
            assert!(!t.description.is_empty());
            assert!(t.schema["properties"].is_object(), "{}", t.event_type);
        }
        assert_eq!(catalog_body()["data"].as_array().map(Vec::len), Some(8));
        assert!(event_type("agent.run.failed").is_some());
        assert!(event_type("agent.run.exploded").is_none());
    }

    #[test]
    fn every_sample_fits_its_schema() {
        for t in event_types() {
            let validator = jsonschema::validator_for(&t.schema).expect("a JSON Schema");
            let sample = crate::events::sample_data(&t.event_type, "ws_1").expect("a sample");
            let errors: Vec<String> = validator
                .iter_errors(&sample)
                .map(|e| e.to_string())
                .collect();
            assert!(errors.is_empty(), "{}: {errors:?}", t.event_type);
            // And a schema says something: an array is no event's data.
            assert!(
                !validator.is_valid(&serde_json::json!([])),
                "{}",
                t.event_type
            );
        }
    }
}
