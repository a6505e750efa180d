package bed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/triage-queue/triage/deploy/drill"
)

// Client drives a bed that runs in another process (`triage up`) for a
// drill: its routers from bed.json, and faults through the bed's control
// endpoint. It is a drill.Bed.
type Client struct {
	layout *Layout
}

var _ drill.Bed = (*Client)(nil)

// Dial reads the bed.json of the bed running in dir.
func Dial(dir string) (*Client, error) {
	l, err := ReadLayout(dir)
	if err != nil {
		return nil, fmt.Errorf("no running bed found (start one with make up): %w", err)
	}
	if l.Control == "" {
		return nil, errors.New("this bed has no control endpoint")
	}
	return &Client{layout: l}, nil
}

// Routers lists every region's router by its gRPC address.
func (c *Client) Routers(context.Context) ([]drill.Router, error) {
	var out []drill.Router
	for _, r := range c.layout.Regions {
		out = append(out, drill.Router{Region: r.Name, Addr: r.GRPC, Token: c.layout.Token})
	}
	return out, nil
}

// Inject asks the bed to inject f (POST /fault/SCENARIO). The bed acts
// within milliseconds, so the fault takes effect by the time it answers.
func (c *Client) Inject(ctx context.Context, f drill.Fault) (drill.Injection, error) {
	desc, err := c.control(ctx, "fault", f)
	return drill.Injection{Description: desc}, err
}

// Heal asks the bed to heal f (POST /heal/SCENARIO).
func (c *Client) Heal(ctx context.Context, f drill.Fault) (string, error) {
	return c.control(ctx, "heal", f)
}

// Fate asks the bed what became of f's old primary (POST /fate/SCENARIO).
func (c *Client) Fate(ctx context.Context, f drill.Fault) (string, error) {
	return c.control(ctx, "fate", f)
}

// control calls the control endpoint (see serveControl).
func (c *Client) control(ctx context.Context, action string, f drill.Fault) (string, error) {
	u := url.URL{Scheme: "http", Host: c.layout.Control, Path: "/" + action + "/" + f.Scenario,
		RawQuery: url.Values{"region": {f.Region}, "shard": {fmt.Sprint(f.Shard)}}.Encode()}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Description string `json:"description"`
		Error       string `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("bed control %s: %s", u.Path, resp.Status)
	}
	if out.Error != "" {
		return "", fmt.Errorf("bed control %s: %s", u.Path, out.Error)
	}
	return out.Description, nil
}
