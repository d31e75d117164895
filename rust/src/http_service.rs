//! One request on the compiled HTTP door: its head's size checked and its body read (bounded in size
//! and time), then queued for Python (`queue.rs`) and answered as Python says, to HTTP/1.0 as
//! uvicorn answers it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Version};
use tokio::sync::oneshot;

use crate::http::{HttpBounds, HttpRequest, MAX_BODY};
use crate::http_answers::{error_response, Whole};
use crate::http_stream::{InFlight, PhaseCell};
use crate::shared::{seconds, Shared};

/// Bytes a queued request holds: its target, headers and body, and their allocations.
fn weight(request: &HttpRequest) -> usize {
    let headers: usize = request
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 64)
        .sum();
    256 + request.method.len() + request.target.len() + headers + request.body.len()
}

/// Queue `request` for Python and wait for its answer (at most the request timeout).
async fn decide(shared: Arc<Shared>, request: HttpRequest) -> Response<Whole> {
    let (sender, receiver) = oneshot::channel();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let bytes = weight(&request);
    let deadline = tokio::time::Instant::now() + shared.bounds.request_timeout;
    let first = {
        let mut state = shared.state.lock().unwrap();
        if let Some(why) = state.full(&shared, bytes) {
            return error_response(503, &why);
        }
        state.http.push(id, request, sender, bytes, deadline)
    };
    if first {
        shared.wake();
    }
    match tokio::time::timeout_at(deadline, receiver).await {
        Ok(Ok(answer)) => {
            let mut response = Response::new(Whole::new(answer.body));
            *response.status_mut() =
                StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let headers = response.headers_mut();
            for (name, value) in answer.headers {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(&name),
                    HeaderValue::from_bytes(&value),
                ) {
                    headers.append(name, value);
                }
            }
            response
        }
        Ok(Err(_)) if tokio::time::Instant::now() < deadline => {
            error_response(500, "the decision was dropped")
        }
        _ => {
            shared.state.lock().unwrap().http.remove(id);
            error_response(
                503,
                &format!(
                    "no decision within {} seconds",
                    seconds(shared.bounds.request_timeout)
                ),
            )
        }
    }
}

/// One request, answered (`answer`); to HTTP/1.0 as uvicorn answers it: `connection: close`, and an
/// HTTP/1.1 status line (`Tracked::poll_write`; hyper would add `connection: keep-alive` to a 1.1
/// answer when asked for it).
pub async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    peer: SocketAddr,
    local: SocketAddr,
    bounds: Arc<HttpBounds>,
    cell: Arc<PhaseCell>,
) -> Result<Response<Whole>, Infallible> {
    let _in_flight = InFlight::new(cell.clone());
    let http10 = request.version() == Version::HTTP_10;
    let head = request.method() == hyper::Method::HEAD;
    let mut response = answer(shared, request, peer, local, bounds).await;
    let status = response.status().as_u16();
    if !head && status >= 200 && status != 204 && status != 304 {
        // where uvicorn writes it: before a `connection: close` hyper adds
        let length = response.body().size_hint().exact().unwrap_or(0);
        if let hyper::header::Entry::Vacant(entry) =
            response.headers_mut().entry(hyper::header::CONTENT_LENGTH)
        {
            entry.insert(if length == 0 {
                HeaderValue::from_static("0")
            } else {
                HeaderValue::from(length)
            });
        }
    }
    if http10 {
        *response.version_mut() = Version::HTTP_10;
        let close = response
            .headers()
            .get_all(hyper::header::CONNECTION)
            .iter()
            .any(|value| {
                value
                    .as_bytes()
                    .split(|&byte| byte == b',')
                    .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"close"))
            });
        if !close {
            response
                .headers_mut()
                .append(hyper::header::CONNECTION, HeaderValue::from_static("close"));
        }
        cell.phase.lock().unwrap().http10 = true;
    }
    Ok(response)
}

/// One request: its body read (bounded in size and time), then decided by Python.
async fn answer(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    peer: SocketAddr,
    local: SocketAddr,
    bounds: Arc<HttpBounds>,
) -> Response<Whole> {
    let timeout = bounds.timeout;
    let (parts, body) = request.into_parts();
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
    // As the Python server counts a head received whole: the URL, then each header line.
    let head = target.len()
        + parts
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    if head > bounds.max_header_size {
        let message = format!(
            "the request line and headers are larger than {} bytes",
            bounds.max_header_size
        );
        return error_response(431, &message);
    }
    let body = if parts.uri.path() == "/check" {
        Bytes::new() // a gateway's sub-request: its body is never read
    } else {
        match tokio::time::timeout(timeout, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => {
                let message = format!("the body is larger than {MAX_BODY} bytes");
                return error_response(413, &message);
            }
            Ok(Err(_)) => return error_response(400, "the request body could not be read"),
            Err(_) => {
                let message = format!(
                    "the request was not received whole within {} seconds",
                    seconds(timeout)
                );
                return error_response(408, &message);
            }
        }
    };
    let request = HttpRequest {
        method: parts.method.as_str().to_string(),
        target,
        headers: parts.headers,
        peer,
        local,
        body,
    };
    decide(shared, request).await
}
