// Package faults holds the outbox's fault-injection suite: database servers restarted and
// connections killed while producers commit and publishers deliver, publishers killed with
// SIGKILL to time the lease reclaim, a PostgreSQL primary crashed and its standby promoted,
// a 3-node MariaDB Galera cluster, and a long soak. Its tests start private PostgreSQL and
// MariaDB servers of their own (in temporary directories, on free ports) and never touch
// the shared servers' processes.
//
// The tests run only when OUTBOX_FAULTS=1 (make test-faults); the soak also needs
// OUTBOX_SOAK=1 (make soak). See docs/reliability.md for what they assert and their figures.
package faults
