//! The socket datapath (being written).
