package tiktoken

import (
	"encoding/base64"
	"image"
	_ "image/gif" // image.DecodeConfig reads the headers of
	_ "image/jpeg"
	_ "image/png"
	"math"
	"strings"
)

// What OpenAI's documented image formula counts for GPT-4o and GPT-4.1 (and
// GPT-4 Turbo): 85 tokens for an image sent with detail "low", and for one
// sent with detail "high" or "auto" 85 plus 170 per 512-pixel tile of the
// image once scaled to fit in 2048 x 2048 and then to a shortest side of 768
// (no image is scaled up). An image whose size cannot be read from the
// request (a URL, or data this package cannot decode) is counted at the most
// the formula gives: 8 tiles, as for a 768 x 2048 image.
const (
	imageBase     = 85
	imageTile     = 170
	imageMaxTiles = 8
)

// maxImageHeader bounds what is decoded of a data URL to read the image's
// size: the header of a PNG or GIF is at its start, and a JPEG's frame
// header follows its metadata.
const maxImageHeader = 64 << 10

// imageTokens counts an image_url content part.
func imageTokens(url, detail string) int {
	if detail == "low" {
		return imageBase
	}
	w, h, ok := dataURLSize(url)
	if !ok {
		return imageBase + imageTile*imageMaxTiles
	}
	return tileTokens(w, h)
}

// tileTokens counts an image of w x h pixels sent with detail "high".
func tileTokens(w, h int) int {
	fw, fh := float64(w), float64(h)
	if long := math.Max(fw, fh); long > 2048 {
		fw, fh = fw*2048/long, fh*2048/long
	}
	if short := math.Min(fw, fh); short > 768 {
		fw, fh = fw*768/short, fh*768/short
	}
	tiles := math.Ceil(fw/512) * math.Ceil(fh/512)
	return imageBase + imageTile*int(min(max(tiles, 1), imageMaxTiles))
}

// dataURLSize reads the size of the image a base64 data URL holds, from at
// most maxImageHeader bytes of it.
func dataURLSize(url string) (w, h int, ok bool) {
	rest, found := strings.CutPrefix(url, "data:")
	if !found {
		return 0, 0, false
	}
	meta, data, found := strings.Cut(rest, ",")
	if !found || !strings.HasSuffix(meta, ";base64") {
		return 0, 0, false
	}
	data = data[:min(len(data), maxImageHeader)]
	cfg, _, err := image.DecodeConfig(base64.NewDecoder(base64.StdEncoding, strings.NewReader(data)))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}
