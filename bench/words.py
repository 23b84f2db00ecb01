"""bench/words.py: the words bench/serve.py makes its prompts of and
bench/serve_engine.py builds its test tokenizer with: a module of their
own, so that neither of the two imports the other."""

# prompts: short common English words, each one token (with its leading
# space) in the BPE vocabularies of Llama, Qwen, Mistral and GPT-2, so a
# prompt of N words tokenizes to about N tokens; the server's own count
# (usage.prompt_tokens, when it sends one) is reported beside the asked one.
# bench/serve_engine.py builds its test tokenizer with these words first.

WORDS = """the of and to in is was he for it with as his on be at by had are but from or
have an they which one you were all we her she there would their will when who him been has
more if no out so said what up its about than into them can only other time new some could
these two may first then do any like my now over such our man me even most made after also
did many before must through back years where much your way well down should because each
just those people how too little state good very make world still own see men work long get
here between both life being under never day same another know while last might us great old
year off come since against go came right used take three house use during without again place
around however home small found thought went say part once high general upon school every
don does got left number course war until always away something fact though water less public
put think almost hand enough far took head yet government system better set told nothing night
end why called didn eyes find going look asked later knew point next program city business give
group toward young days let room president side social given present several order national
second possible rather per face among form important often things looking early white case john
become large big need four within felt along children saw best church ever least power
development light""".split()
assert len(set(WORDS)) == len(WORDS)
