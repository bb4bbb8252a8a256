//! The streams a [`Node`](crate::Node) hands out: its views and its lock events.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use conclave_lock_api::{LockEvent, View};
use futures::stream::BoxStream;
use futures::Stream;

/// A stream of views; see [`Node::views`](crate::Node::views).
pub struct Views {
    stream: BoxStream<'static, View>,
}

impl Views {
    pub(crate) fn new(stream: BoxStream<'static, View>) -> Self {
        Self { stream }
    }
}

impl fmt::Debug for Views {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Views").finish_non_exhaustive()
    }
}

impl Stream for Views {
    type Item = View;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<View>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// A stream of lock events; see [`Node::lock_events`](crate::Node::lock_events) and [`crate::LockService::lock_events`].
pub struct LockEvents {
    stream: BoxStream<'static, LockEvent>,
}

impl LockEvents {
    pub(crate) fn new(stream: BoxStream<'static, LockEvent>) -> Self {
        Self { stream }
    }
}

impl fmt::Debug for LockEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockEvents").finish_non_exhaustive()
    }
}

impl Stream for LockEvents {
    type Item = LockEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LockEvent>> {
        self.stream.as_mut().poll_next(cx)
    }
}
