// The chat fields of an OpenAI /v1/chat/completions (or vLLM /tokenize)
// request, prepared the way vLLM prepares them before it applies a model's
// chat template, and rendered with the model's ChatTemplate.
//
// Fields: messages (role a string the template accepts; content a string,
// an array of {"type": "text", "text"} parts, or null in an assistant message
// with tool_calls; assistant tool_calls' function.arguments given as a JSON
// string become the object it encodes), tools, tool_choice ("auto",
// "none", "required" or a named function: the last two are constrained by
// structured_request.h), documents, chat_template_kwargs, add_generation_prompt (default
// true), continue_final_message, chat_template_time (Tandem's: the time the
// template's strftime_now shows). A chat_template in the request is refused.
// Every refusal is an ApiError naming the field.
//
// Pure function of its arguments; safe from any thread.
#pragma once

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "common/protocol/chat_template.h"
#include "common/protocol/openai_protocol.h"

namespace tandem::server {

// The template input for the request object `root` (parsed keeping key
// order); `chat_template` decides how content parts are passed.
// `reasoning_as_thinking` (the server reads gpt-oss's harmony output): an
// assistant message's reasoning_content (or vLLM's newer name, reasoning),
// a string, also reaches the template as `thinking`, the field gpt-oss's
// template writes into the analysis channel, unless the message has one, as
// vLLM's harmony input turns it into the analysis message. Other templates
// see messages as sent (LFM2.5's reads `thinking` too, and transformers
// does not map it).
Result<ChatTemplateInput> readChatInput(const nlohmann::ordered_json& root,
                                        const ChatTemplate& chat_template,
                                        bool reasoning_as_thinking = false);

// The rendered prompt text for `root`. A null or empty `chat_template` (the
// model has none) and a template failure are 400s; a template failure's
// message names the template line, with param "messages". `cancel`, when
// set by another thread while the template renders (the client left), ends
// rendering early with an error; null: never.
//
// strftime_now shows the request's chat_template_time ("2025-03-07T09:05:03",
// naive: no zone) when given, else the clock's local time to the second;
// `template_time`, when not null, receives the time shown in that form, so
// that another server rendering the same request shows the same time.
// `reasoning_as_thinking` as readChatInput's.
Result<std::string> renderChatRequest(const nlohmann::ordered_json& root,
                                      const ChatTemplate* chat_template,
                                      const std::atomic<bool>* cancel = nullptr,
                                      std::string* template_time = nullptr,
                                      bool reasoning_as_thinking = false);

}  // namespace tandem::server
