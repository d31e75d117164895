//! The HTTP door's side of the boundary (`batch.rs`): a queued request as Python takes it, and
//! Python's answer as hyper writes it.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::http::{HttpAnswer, HttpRequest};

/// A request as Python takes it: `(id, method, target, headers, (peer host, peer port), (local
/// host, local port), body)`; `headers` a list of `(name, value)` bytes, names in lowercase.
pub fn request(py: Python<'_>, id: u64, request: HttpRequest) -> PyResult<Bound<'_, PyTuple>> {
    let headers = PyList::empty(py);
    for (name, value) in request.headers.iter() {
        headers.append((
            PyBytes::new(py, name.as_str().as_bytes()),
            PyBytes::new(py, value.as_bytes()),
        ))?;
    }
    let peer = (
        request.peer.ip().to_canonical().to_string(),
        request.peer.port(),
    );
    let local = (
        request.local.ip().to_canonical().to_string(),
        request.local.port(),
    );
    let body = PyBytes::new(py, &request.body);
    (
        id,
        request.method,
        request.target,
        headers,
        peer,
        local,
        body,
    )
        .into_pyobject(py)
}

/// An answer as Python gives it: `(id, status, headers, body)`, `headers` the complete list of
/// `(name, value)` bytes.
pub fn answer(item: &Bound<'_, PyAny>) -> PyResult<(u64, HttpAnswer)> {
    type Pair<'a> = (Bound<'a, PyBytes>, Bound<'a, PyBytes>);
    let (id, status, headers, body): (u64, u16, Vec<Pair<'_>>, Bound<'_, PyBytes>) =
        item.extract()?;
    let headers = headers
        .iter()
        .map(|(name, value)| (name.as_bytes().to_vec(), value.as_bytes().to_vec()))
        .collect();
    let body = body.as_bytes().to_vec();
    Ok((
        id,
        HttpAnswer {
            status,
            headers,
            body,
        },
    ))
}
