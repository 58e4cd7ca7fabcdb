//! The OpenAPI document: served, version 3.1, every route documented, and the documented
//! records match what the server really sends.

use std::collections::BTreeSet;

use http::StatusCode;
use kesoku_core::{Message, TurnMetrics, TurnOrigin};
use serde_json::Value;

use crate::harness::{TestServer, get, send, user};

#[tokio::test]
async fn the_document_is_served_and_lists_every_route() {
    let server = TestServer::new().await;
    let reply = send(&server.app(), get("/openapi.json")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json["openapi"], "3.1.0");
    let paths: BTreeSet<String> = reply.json["paths"].as_object().expect("paths").keys().cloned().collect();
    let expected: BTreeSet<String> = [
        "/v1/messages",
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/messages",
        "/v1/sessions/{id}/stop",
        "/v1/sessions/{id}/compact",
        "/v1/sessions/{id}/clear",
        "/v1/sessions/{id}/state",
        "/v1/sessions/{id}/export",
        "/v1/events",
        "/v1/activations",
        "/v1/runtime",
        "/healthz",
        "/readyz",
        "/metrics",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(paths, expected);
    assert_eq!(reply.json, serde_json::to_value(kesoku_server::openapi_document()).expect("json"));
    let schemes = &reply.json["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(reply.json["paths"]["/healthz"]["get"]["security"], serde_json::json!([{}]), "health is open");
}

/// Check `value` against the document's schema `name`: required fields present, no field the
/// schema does not name, enum values listed.
fn check_against(document: &Value, name: &str, value: &Value) {
    let schema = &document["components"]["schemas"][name];
    let properties = schema["properties"].as_object().unwrap_or_else(|| panic!("schema {name} has properties"));
    let object = value.as_object().unwrap_or_else(|| panic!("{name}: {value} is an object"));
    for required in schema["required"].as_array().into_iter().flatten() {
        let key = required.as_str().unwrap_or_default();
        assert!(object.contains_key(key), "{name}: required `{key}` missing in {value}");
    }
    for (key, field) in object {
        let property = properties.get(key).unwrap_or_else(|| panic!("{name}: `{key}` is not documented"));
        if let Some(reference) = property["$ref"].as_str() {
            let target = reference.rsplit('/').next().unwrap_or_default();
            let allowed = &document["components"]["schemas"][target]["enum"];
            if let Some(allowed) = allowed.as_array() {
                assert!(allowed.contains(field), "{name}.{key}: {field} not in {allowed:?}");
            }
        }
    }
}

#[tokio::test]
async fn documented_records_match_what_the_server_sends() {
    let server = TestServer::new().await;
    let document = serde_json::to_value(kesoku_server::openapi_document()).expect("json");
    let session = server.session("api", "web").await;
    let root = server.post(&user(&session, "hi")).await;
    let origin = TurnOrigin::of(&root, "Kesoku");
    let call = origin.tool_call(1, "c1", "search", serde_json::json!({"q": 1}));
    let samples: Vec<Message> = vec![
        root.clone(),
        origin.thought(1, "hmm", Some("sig".into())),
        call.clone(),
        origin.tool_result(&call, "r", None, Some("boom".into())),
        origin.final_text(2, "done", Some(TurnMetrics::default())),
        origin.notification("compacted"),
    ];
    for message in samples {
        check_against(&document, "Message", &serde_json::to_value(&message).expect("json"));
    }
    let app = server.app();
    let list = send(&app, get("/v1/sessions")).await;
    check_against(&document, "SessionView", &list.json["sessions"][0]);
    let state = send(&app, get(&format!("/v1/sessions/{}/state", session.id))).await;
    check_against(&document, "SessionStateResponse", &state.json);
    check_against(&document, "LastEventView", &state.json["last_event"]);
    check_against(&document, "WaitingView", &state.json["waiting"][0]);
    let runtime = send(&app, get("/v1/runtime")).await;
    check_against(&document, "LaneDepths", &runtime.json["queue"]);
    let trigger = send(
        &app,
        crate::harness::post_json(
            "/v1/activations",
            &serde_json::json!({"task": "t", "chatbot_id": "api", "channel_id": "web", "timezone": "Europe/Paris"}),
        ),
    )
    .await;
    check_against(&document, "PostActivationResponse", &trigger.json);
    let zones = document["components"]["schemas"]["Timezone"]["enum"].as_array().expect("the time zone names");
    assert!(zones.contains(&Value::from("Europe/Paris")) && zones.contains(&Value::from("UTC")), "{zones:?}");
    let error = send(&app, get("/v1/sessions/nope")).await;
    check_against(&document, "ErrorBody", &error.json);
    check_against(&document, "ErrorDetail", &error.json["error"]);
}
