package llmclient

// ChatRequest is a chat completion request: the subset of the OpenAI API
// that every compatible provider accepts.
type ChatRequest struct {
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	// MaxTokens bounds the completion; 0 leaves it to the provider.
	MaxTokens int `json:"max_tokens,omitempty"`
	// MaxCompletionTokens is OpenAI's newer name for MaxTokens; 0 leaves it
	// to the provider.
	MaxCompletionTokens int `json:"max_completion_tokens,omitempty"`
	// Temperature is the sampling temperature; nil leaves it to the
	// provider.
	Temperature *float64 `json:"temperature,omitempty"`
}

// Message is one message of a conversation.
type Message struct {
	Role    string `json:"role"` // "system", "user", "assistant", …
	Content string `json:"content"`
}

// Response is a chat completion.
type Response struct {
	ID      string   `json:"id"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   Usage    `json:"usage"`
}

// Choice is one of a completion's alternatives.
type Choice struct {
	Index        int     `json:"index"`
	Message      Message `json:"message"`
	FinishReason string  `json:"finish_reason"` // "stop", "length", …
}

// Usage is the tokens a completion used, as the provider counts them.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Chunk is one event of a streamed chat completion.
type Chunk struct {
	ID      string        `json:"id"`
	Model   string        `json:"model"`
	Choices []ChunkChoice `json:"choices"`
	// Usage is set on the last chunk only, which has no choices.
	Usage *Usage `json:"usage"`
}

// ChunkChoice is what a chunk adds to one of the completion's alternatives.
type ChunkChoice struct {
	Index int `json:"index"`
	// Delta holds the next piece of the message's content (and its role,
	// in the first chunk).
	Delta        Message `json:"delta"`
	FinishReason string  `json:"finish_reason"` // set in the alternative's last chunk
}
