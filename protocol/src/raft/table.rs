//! placeholder (the helper writes the real table)
#![allow(missing_docs, dead_code, unused_variables)]
use std::collections::BTreeSet;

use conclave_lock_api::wire::TableLock;
use conclave_lock_api::{FencingToken, LockMode, MemberId, OwnerId, ServiceName};

use super::command::{Applied, Command, LockKey};

#[derive(Clone, Debug, Default)]
pub struct Table;
impl Table {
    pub fn new() -> Self {
        Table
    }
    pub fn apply(&mut self, index: u64, command: &Command, out: &mut Vec<Applied>) {}
    pub fn applied_index(&self) -> u64 {
        0
    }
    pub fn locks(&self, service: Option<&ServiceName>, max: usize) -> (Vec<TableLock>, bool) {
        (vec![], false)
    }
    pub fn leased_holds(&self) -> Vec<(LockKey, FencingToken, u64)> {
        vec![]
    }
    pub fn recovered_holds(&self, name: &str) -> Vec<(LockKey, OwnerId, LockMode, FencingToken)> {
        vec![]
    }
    pub fn requests_of(&self, member: &MemberId) -> Vec<(u64, LockKey, Option<FencingToken>)> {
        vec![]
    }
    pub fn member_names(&self) -> BTreeSet<String> {
        BTreeSet::new()
    }
    pub fn to_bytes(&self) -> Vec<u8> {
        vec![]
    }
    pub fn from_bytes(bytes: &[u8]) -> Option<Table> {
        Some(Table)
    }
}
