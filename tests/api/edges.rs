//! The HTTP edge, by subject: bad input, who may call what, and a store
//! that is down.

mod input;
mod store_down;
mod trust;
