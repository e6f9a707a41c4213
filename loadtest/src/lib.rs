//! Load and fault harness for posgate (grows in the load-harness issue).
