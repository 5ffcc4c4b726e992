package customdialect

// Plant changes the dialect's SQL to one of the bugs of the mutation test
// (TestConformanceCatchesBugs), for the whole test process: a child of its own.
func Plant(bug string) bool {
	switch bug {
	case "now-tie": // the transaction's now(): a settle and the claim after it tie
		now = `now()`
	case "no-row-locks": // claimers no longer skip each other's candidates: they share them
		lockRows = ``
	default:
		return false
	}
	return true
}
