-- Lock stripes for dedupe keys: 4096 rows that always exist. An enqueue with dedupe keys
-- first locks the stripes of its keys (SELECT ... FOR UPDATE, in stripe order), then reserves
-- the keys in <table>_dedupe. Producers racing for one key therefore queue on a row that
-- exists, one at a time, instead of waiting on the winner's uncommitted key: when a winner
-- rolls back, InnoDB removes its key and hands the waiters' locks on it over to the gap
-- around it, where every waiter holds one at once and each insert then waits for the
-- others' (error 1213, Deadlock found). A locking read of the key first does not help: on a
-- missing key it takes the same gap locks. Keys of one stripe (1 in 4096) share its lock.

-- +goose Up
-- +goose ENVSUB ON
CREATE TABLE IF NOT EXISTS `${OUTBOX_TABLE:-outbox_events}_dedupe_lock` (
    stripe SMALLINT UNSIGNED NOT NULL,
    PRIMARY KEY (stripe)
) ENGINE = InnoDB;

INSERT IGNORE INTO `${OUTBOX_TABLE:-outbox_events}_dedupe_lock` (stripe)
SELECT a.n * 256 + b.n * 16 + c.n FROM
    (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5
     UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9 UNION ALL SELECT 10
     UNION ALL SELECT 11 UNION ALL SELECT 12 UNION ALL SELECT 13 UNION ALL SELECT 14 UNION ALL SELECT 15) AS a,
    (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5
     UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9 UNION ALL SELECT 10
     UNION ALL SELECT 11 UNION ALL SELECT 12 UNION ALL SELECT 13 UNION ALL SELECT 14 UNION ALL SELECT 15) AS b,
    (SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5
     UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9 UNION ALL SELECT 10
     UNION ALL SELECT 11 UNION ALL SELECT 12 UNION ALL SELECT 13 UNION ALL SELECT 14 UNION ALL SELECT 15) AS c;

-- +goose Down
-- +goose ENVSUB ON
DROP TABLE IF EXISTS `${OUTBOX_TABLE:-outbox_events}_dedupe_lock`;
