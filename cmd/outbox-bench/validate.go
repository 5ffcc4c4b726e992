package main

import "context"

// counterValidation runs a known number of transactions through a counted pool and
// reports what the backend's commit counter saw.
type counterValidation struct {
	Workload string      `json:"workload"`
	Expected string      `json:"expected"`
	Count    commitCount `json:"count"`
}

// validateCounter: 1 transaction inserting a business row, 200 autocommit UPDATEs, 100
// explicit transactions of two UPDATEs each and 50 autocommit SELECTs: 301 committed
// write transactions, 351 transactions in all.
func validateCounter(ctx context.Context, _ config, b backend, res *backendResult) error {
	if err := b.reset(ctx, mainTable); err != nil {
		return err
	}
	finish, err := b.countStart(ctx)
	if err != nil {
		return err
	}
	db, c, err := b.pool(1)
	if err != nil {
		return err
	}
	raw := b.raw(mainTable)
	work := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := raw.insertBusiness(ctx, tx, 1); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		const upd = `UPDATE ` + businessTable + ` SET amount_cents = amount_cents + 1 WHERE customer_id = 1`
		for range 200 {
			if _, err := db.ExecContext(ctx, upd); err != nil {
				return err
			}
		}
		for range 100 {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			for range 2 {
				if _, err := tx.ExecContext(ctx, upd); err != nil {
					_ = tx.Rollback()
					return err
				}
			}
			if err := tx.Commit(); err != nil {
				return err
			}
		}
		for range 50 {
			var n int64
			if err := db.QueryRowContext(ctx, `SELECT amount_cents FROM `+businessTable+` WHERE customer_id = 1`).Scan(&n); err != nil {
				return err
			}
		}
		return nil
	}
	werr := work()
	cc, err := finish(ctx, db, c)
	if werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	res.Validation = &counterValidation{
		Workload: "1 tx (INSERT), 200 autocommit UPDATE, 100 tx of 2 UPDATE, 50 autocommit SELECT on one connection",
		Expected: "301 committed write transactions, 351 transactions in all (MariaDB Handler_commit: 1+1 + 200 + 100*(2+1) + 50 = 552)",
		Count:    cc,
	}
	logf("%s: counter validation: server %d; %s", b.name(), cc.Server, cc.Check)
	return nil
}
