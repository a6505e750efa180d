package client

// ItemError reports that the server refused one item of a call that
// otherwise succeeded, for example a nack with a stale lease token.
type ItemError struct {
	// ID is the item's ID.
	ID string
	// Reason is the server's explanation (ItemResult.error).
	Reason string
}

func (e *ItemError) Error() string {
	return "item " + e.ID + ": " + e.Reason
}
